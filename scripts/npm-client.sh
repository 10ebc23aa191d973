#!/usr/bin/env bash
# Installs the official `openai` and `@anthropic-ai/sdk` npm packages, pinned, into a cache outside
# the checkout (for the server's real-client tests) and prints the directory that holds their
# node_modules. Runs npm only
# the first time; afterwards it only prints the directory.
#   npm-client.sh agents-sdk: the OpenAI Agents SDK instead, in a directory of its own (it wants
#   openai 7 and zod 4).
set -euo pipefail
if [ "${1:-}" = agents-sdk ]; then
  AGENTS_VERSION=0.20.0 AGENTS_ZOD_VERSION=4.6.7 AGENTS_OPENAI_VERSION=7.60.0
  CACHE=${OFFGRAPH_CACHE:-$HOME/.cache/offgraph}
  DIR=$CACHE/npm-openai-agents-$AGENTS_VERSION-openai-$AGENTS_OPENAI_VERSION-zod-$AGENTS_ZOD_VERSION
  if [ -f "$DIR/.installed" ]; then echo "$DIR"; exit 0; fi
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/npm-agents-sdk.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "npm-client: npm install @openai/agents@$AGENTS_VERSION openai@$AGENTS_OPENAI_VERSION zod@$AGENTS_ZOD_VERSION" >&2
  (cd "$tmp" && npm init -y >/dev/null && npm install --no-audit --no-fund --ignore-scripts \
    --loglevel=error "@openai/agents@$AGENTS_VERSION" "openai@$AGENTS_OPENAI_VERSION" \
    "zod@$AGENTS_ZOD_VERSION" >&2)
  node -e "require('$tmp/node_modules/@openai/agents'); require('$tmp/node_modules/zod')" ||
    { echo "npm-client: @openai/agents does not load" >&2; exit 1; }
  rm -rf "$DIR"
  mv "$tmp" "$DIR"
  trap - EXIT
  touch "$DIR/.installed"
  echo "$DIR"
  exit 0
fi
VERSION=6.49.0
# zod: what the client's zodResponseFormat / zodFunction helpers build schemas from.
ZOD_VERSION=3.25.76
ANTHROPIC_VERSION=1.17.0
CACHE=${OFFGRAPH_CACHE:-$HOME/.cache/offgraph}
DIR=$CACHE/npm-openai-$VERSION-zod-$ZOD_VERSION-anthropic-$ANTHROPIC_VERSION
if [ -f "$DIR/.installed" ]; then echo "$DIR"; exit 0; fi
if ! command -v npm >/dev/null; then
  echo "npm-client: installing Node.js and npm (Debian packages)" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y -qq nodejs npm >&2
fi
mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/npm-openai.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "npm-client: npm install openai@$VERSION zod@$ZOD_VERSION @anthropic-ai/sdk@$ANTHROPIC_VERSION" >&2
(cd "$tmp" && npm init -y >/dev/null && npm install --no-audit --no-fund --ignore-scripts \
  --loglevel=error "openai@$VERSION" "zod@$ZOD_VERSION" "@anthropic-ai/sdk@$ANTHROPIC_VERSION" >&2)
node -e "require('$tmp/node_modules/openai'); require('$tmp/node_modules/zod'); require('$tmp/node_modules/@anthropic-ai/sdk')" ||
  { echo "npm-client: openai, zod or @anthropic-ai/sdk does not load" >&2; exit 1; }
rm -rf "$DIR"
mv "$tmp" "$DIR"
trap - EXIT
touch "$DIR/.installed"
echo "$DIR"
