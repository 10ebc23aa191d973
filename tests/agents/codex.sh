#!/usr/bin/env bash
# Codex CLI, the real client (pinned by scripts/agent-clients.sh), against `offgraph serve` on the
# shipped model through the Responses API: `codex exec --json` completes a turn, and a second
# exec resuming the session completes one too, its prompt read from the cache up to what the
# first turn sent. Codex sends a hosted web_search tool: the server runs with
# --drop-hosted-tools, and its metrics must count the tool left out. A third turn turns on Codex's
# freeform apply_patch (a custom tool with a Lark grammar), which the server must take and enforce. As in claude_code.sh, both
# run in a loopback-only network namespace where the kernel allows one.
#   codex.sh OFFGRAPH MODEL WORKDIR SOURCE_DIR
set -euo pipefail
offgraph=$1 model=$2 dir=$3 src=$4
. "$src/tests/agents/loopback.sh"
agents_loopback codex "$src" "$0" "$@"
codex=$clients/node_modules/.bin/codex
rm -rf "$dir/codex"
mkdir -p "$dir/codex/home" "$dir/codex/work"
log=$dir/codex/serve.log
. "$src/tests/serve_ready.sh"
serve_ready "$log" "$offgraph" serve -m "$model" --port 0 -c 131072 --alias agents-test --drop-hosted-tools

# Codex's own settings: a custom provider on the Responses wire, no update check, no analytics.
cat >"$dir/codex/home/config.toml" <<TOML
model = "agents-test"
model_provider = "offgraph"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.offgraph]
name = "offgraph"
base_url = "http://127.0.0.1:$port/v1"
wire_api = "responses"
env_key = "OFFGRAPH_AGENTS_KEY"
TOML
export CODEX_HOME=$dir/codex/home HOME=$dir/codex/home OFFGRAPH_AGENTS_KEY=sk-offgraph-agents
cd "$dir/codex/work"
check() { # turn file, turn number[, the turn file this one resumes]
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
path, turn = sys.argv[1], int(sys.argv[2])
def usage(path, turn):
    done = failed = None
    for line in open(path):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("type") == "turn.completed":
            done = e
        if e.get("type") in ("turn.failed", "error"):
            failed = e
    if failed or not done:
        sys.exit(open(path).read()[-3000:] + "\nturn %d: not completed" % turn)
    u = done["usage"]
    return u["input_tokens"], u.get("cached_input_tokens", 0), u["output_tokens"]
got = usage(path, turn)
# A resumed session reports its running total: the turn's own is the difference.
if len(sys.argv) > 3:
    before = usage(sys.argv[3], turn - 1)
    got = tuple(a - b for a, b in zip(got, before))
print("turn %d: completed, input %d tokens, %d cached, %d out" % ((turn,) + got))
if len(sys.argv) > 3 and got[1] <= 0:
    sys.exit("turn %d: nothing read from the cache" % turn)
PY
}
timeout 600 "$codex" exec --json --skip-git-repo-check "Say hello" </dev/null \
  >"$dir/codex/turn1.jsonl" 2>&1 || true
check "$dir/codex/turn1.jsonl" 1
timeout 600 "$codex" exec --json --skip-git-repo-check resume --last "And goodbye" </dev/null \
  >"$dir/codex/turn2.jsonl" 2>&1 || true
check "$dir/codex/turn2.jsonl" 2 "$dir/codex/turn1.jsonl"
metric() { curl -s "http://127.0.0.1:$port/metrics" | sed -n "s/^$1 \([0-9.e+]*\)$/\1/p"; }
tables=$(metric offgraph_grammar_tables)
# A third turn with apply_patch as Codex's freeform tool: a custom tool with its Lark grammar,
# which binds the call, so the turn is sampled under a grammar (new mask tables) and no request
# is refused.
timeout 600 "$codex" exec --json --skip-git-repo-check \
  -c "model_catalog_json=\"$src/tests/agents/codex_models.json\"" "Add a file" </dev/null >"$dir/codex/turn3.jsonl" 2>&1 || true
check "$dir/codex/turn3.jsonl" 3
curl -s "http://127.0.0.1:$port/metrics" |
  grep -E '^offgraph_(prompt_tokens_(total|computed_total|cached_total)|dropped_tools_total|grammar_tables|requests_client_errors_total) '
dropped=$(metric offgraph_dropped_tools_total)
[ "${dropped%.*}" -ge 2 ] || { echo "the hosted tools Codex sent were not counted as dropped"; exit 1; }
[ "$(metric offgraph_grammar_tables)" != "$tables" ] ||
  { echo "turn 3 was not sampled under apply_patch's grammar"; exit 1; }
[ "$(metric offgraph_requests_client_errors_total)" = 0 ] || { echo "a request was refused"; exit 1; }
echo "codex: 3 turns ok"
