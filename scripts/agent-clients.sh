#!/usr/bin/env bash
# Installs the agent clients the `agents` tests drive, pinned, into a cache outside the checkout,
# and prints the directory whose node_modules/.bin holds them. Runs npm only the first time.
#   Claude Code: @anthropic-ai/claude-code (its native binary comes in a platform package)
#   Codex: @openai/codex (likewise)
#   opencode: opencode-ai (likewise; its postinstall links the platform's binary)
set -euo pipefail
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
OPENCODE_VERSION=1.18.33
CACHE=${OFFGRAPH_CACHE:-$HOME/.cache/offgraph}
DIR=$CACHE/npm-agents-claude-code-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION-opencode-$OPENCODE_VERSION
if [ -f "$DIR/.installed" ]; then echo "$DIR"; exit 0; fi
if ! command -v npm >/dev/null; then
  echo "agent-clients: installing Node.js and npm (Debian packages)" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y -qq nodejs npm >&2
fi
mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/npm-agents.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "agent-clients: npm install @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION @openai/codex@$CODEX_VERSION opencode-ai@$OPENCODE_VERSION" >&2
# Install scripts stay on: Claude Code's and opencode's pick their platform's binary.
# opencode's postinstall starts its binary, which makes its XDG directories: kept in $tmp.
(cd "$tmp" && export XDG_CONFIG_HOME=$tmp/.xdg/config XDG_DATA_HOME=$tmp/.xdg/data \
  XDG_CACHE_HOME=$tmp/.xdg/cache XDG_STATE_HOME=$tmp/.xdg/state &&
  npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" \
  "opencode-ai@$OPENCODE_VERSION" >&2)
HOME=$tmp "$tmp/node_modules/.bin/claude" --version >&2 ||
  { echo "agent-clients: claude does not start" >&2; exit 1; }
HOME=$tmp "$tmp/node_modules/.bin/codex" --version >&2 ||
  { echo "agent-clients: codex does not start" >&2; exit 1; }
HOME=$tmp "$tmp/node_modules/.bin/opencode" --version >&2 ||
  { echo "agent-clients: opencode does not start" >&2; exit 1; }
rm -rf "$DIR"
mv "$tmp" "$DIR"
trap - EXIT
touch "$DIR/.installed"
echo "$DIR"
