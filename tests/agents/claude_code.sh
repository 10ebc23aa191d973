#!/usr/bin/env bash
# Claude Code, the real client (pinned by scripts/agent-clients.sh), against `offgraph serve` on
# the shipped model: `claude -p` and then three `--continue` turns. Every turn's result must say
# is_error false, and from the second turn on the prompt tokens the server reported as read from
# its cache must be at least 90% of the turn's prompt. The server and the client run in a network
# namespace of their own with loopback only (where the kernel lets an unprivileged user make one),
# so nothing can reach another address; telemetry, error reports and updates are off by Claude
# Code's own variables either way.
#   claude_code.sh OFFGRAPH MODEL WORKDIR SOURCE_DIR
set -euo pipefail
offgraph=$1 model=$2 dir=$3 src=$4
. "$src/tests/agents/loopback.sh"
agents_loopback claude_code "$src" "$0" "$@"
claude=$clients/node_modules/.bin/claude
rm -rf "$dir/claude-code"
mkdir -p "$dir/claude-code/home" "$dir/claude-code/work"
log=$dir/claude-code/serve.log
# Claude Code's system prompt and tools come to about 36,000 tokens of this model's vocabulary,
# and it asks for max_tokens 32000: the context holds both.
. "$src/tests/serve_ready.sh"
serve_ready "$log" "$offgraph" serve -m "$model" --port 0 -c 131072 --alias agents-test --alias 'claude-*'

export HOME=$dir/claude-code/home
export ANTHROPIC_BASE_URL=http://127.0.0.1:$port ANTHROPIC_API_KEY=sk-offgraph-agents
export ANTHROPIC_MODEL=agents-test ANTHROPIC_SMALL_FAST_MODEL=agents-test
export DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 DISABLE_AUTOUPDATER=1
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CLAUDE_CODE_MAX_RETRIES=0
cd "$dir/claude-code/work"
turn=0
for prompt in "Say hello" "What did I just ask you?" "Name a colour." "Thank you, that is all."; do
  turn=$((turn + 1))
  more=()
  [ $turn -gt 1 ] && more=(--continue)
  out=$dir/claude-code/turn$turn.jsonl
  timeout 600 "$claude" -p "$prompt" "${more[@]}" --output-format stream-json --verbose \
    >"$out" 2>&1 || true
  /usr/bin/python3 - "$out" "$turn" <<'PY'
import json, sys
path, turn = sys.argv[1], int(sys.argv[2])
result = None
for line in open(path):
    try:
        event = json.loads(line)
    except ValueError:
        continue
    if event.get("type") == "result":
        result = event
if result is None:
    sys.exit(open(path).read()[-3000:] + "\nturn %d: no result line" % turn)
u = result.get("usage", {})
read = u.get("cache_read_input_tokens", 0)
prompt = u.get("input_tokens", 0) + read + u.get("cache_creation_input_tokens", 0)
share = read / prompt if prompt else 0.0
print("turn %d: is_error %s, prompt %d tokens, %d read from the cache (%.1f%%), %d out: %r" % (
    turn, result.get("is_error"), prompt, read, 100 * share, u.get("output_tokens", 0),
    str(result.get("result"))[:80]))
if result.get("is_error") is not False:
    sys.exit("turn %d: is_error is not false: %s" % (turn, result.get("result")))
if turn > 1 and share < 0.9:
    sys.exit("turn %d: %.1f%% of the prompt read from the cache, under 90%%" % (turn, 100 * share))
PY
done
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^offgraph_prompt_tokens_(total|computed_total|cached_total) '
echo "claude code: 4 turns ok"
