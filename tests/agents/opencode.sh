#!/usr/bin/env bash
# opencode, the real client (pinned by scripts/agent-clients.sh), against `offgraph serve` on the
# shipped model through Chat Completions (its bundled @ai-sdk/openai-compatible provider):
# `opencode run --format json` completes a turn, and a second run continuing the session
# completes one too, its prompt read from the cache up to what the first turn sent. As in
# codex.sh, both run in a loopback-only network namespace where the kernel allows one.
#   opencode.sh OFFGRAPH MODEL WORKDIR SOURCE_DIR
set -euo pipefail
offgraph=$1 model=$2 dir=$3 src=$4
. "$src/tests/agents/loopback.sh"
agents_loopback opencode "$src" "$0" "$@"
opencode=$clients/node_modules/.bin/opencode
rm -rf "$dir/opencode"
home=$dir/opencode/home
mkdir -p "$home" "$dir/opencode/work"
log=$dir/opencode/serve.log
. "$src/tests/serve_ready.sh"
serve_ready "$log" "$offgraph" serve -m "$model" --port 0 -c 131072 --alias agents-test

# opencode's own settings: a custom provider on the Chat Completions wire, no update check, no
# sharing. The model list comes from this file alone (OPENCODE_DISABLE_MODELS_FETCH: no models.dev).
cat >"$home/opencode.json" <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "autoupdate": false,
  "share": "disabled",
  "model": "offgraph/agents-test",
  "provider": {
    "offgraph": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "offgraph",
      "options": { "baseURL": "http://127.0.0.1:$port/v1", "apiKey": "sk-offgraph-agents" },
      "models": {
        "agents-test": { "name": "agents-test", "limit": { "context": 131072, "output": 4096 } }
      }
    }
  }
}
JSON
# At start opencode installs @opencode-ai/plugin into its config directory with npm (in the
# background) unless node_modules is there and package-lock.json already lists what package.json
# asks for: this stands for that install, so it never goes to the registry.
cfg=$home/.config/opencode
mkdir -p "$cfg/node_modules"
echo '{"dependencies":{"@opencode-ai/plugin":"*"}}' >"$cfg/package.json"
echo '{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}' \
  >"$cfg/package-lock.json"
export HOME=$home XDG_CONFIG_HOME=$home/.config XDG_DATA_HOME=$home/.local/share \
  XDG_CACHE_HOME=$home/.cache XDG_STATE_HOME=$home/.local/state OPENCODE_CONFIG=$home/opencode.json \
  OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_SHARE=1 \
  OPENCODE_DISABLE_LSP_DOWNLOAD=1 OPENCODE_DISABLE_DEFAULT_PLUGINS=1 OPENCODE_DISABLE_CLAUDE_CODE=1 \
  OPENCODE_DISABLE_EXTERNAL_SKILLS=1
cd "$dir/opencode/work"
check() { # turn file, turn number[, 1 when >= 90% of the prompt must come from the cache]
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
path, turn = sys.argv[1], int(sys.argv[2])
done = failed = None
for line in open(path):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("type") == "step_finish":
        done = e
    if e.get("type") == "error":
        failed = e
if failed or not done or done["part"].get("reason") == "error":
    sys.exit(open(path).read()[-3000:] + "\nturn %d: not completed" % turn)
# Each step reports its own request's usage (not a running total): input is what was computed.
t = done["part"]["tokens"]
got = (t["input"], t.get("cache", {}).get("read", 0), t["output"])
print("turn %d: completed, input %d tokens, %d cached, %d out" % ((turn,) + got))
if len(sys.argv) > 3 and got[1] < 0.9 * (got[0] + got[1]):
    sys.exit("turn %d: %d of %d prompt tokens read from the cache (< 90%%)" % ((turn, got[1], got[0] + got[1])))
PY
}
timeout 600 "$opencode" run --format json "Say hello" </dev/null \
  >"$dir/opencode/turn1.jsonl" 2>"$dir/opencode/turn1.err" || true
check "$dir/opencode/turn1.jsonl" 1
timeout 600 "$opencode" run --format json --continue "And goodbye" </dev/null \
  >"$dir/opencode/turn2.jsonl" 2>"$dir/opencode/turn2.err" || true
check "$dir/opencode/turn2.jsonl" 2 1
metric() { curl -s "http://127.0.0.1:$port/metrics" | sed -n "s/^$1 \([0-9.e+]*\)$/\1/p"; }
curl -s "http://127.0.0.1:$port/metrics" |
  grep -E '^offgraph_(requests_total|prompt_tokens_(total|computed_total|cached_total)|requests_client_errors_total) '
[ "$(metric offgraph_requests_client_errors_total)" = 0 ] || { echo "a request was refused"; exit 1; }
echo "opencode: 2 turns ok"
