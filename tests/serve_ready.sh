# Sourced by the shell tests that run `offgraph serve --port 0`: starts the command given (its
# output to $1), stops it on exit, and sets `port` from its ready line (60 s at most).
#   . tests/serve_ready.sh; serve_ready LOG OFFGRAPH serve -m MODEL --port 0 ...
serve_ready() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  serve_pid=$!
  trap 'kill $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null || true' EXIT
  port=
  for _ in $(seq 1 600); do
    port=$(sed -n 's|.* on http://127\.0\.0\.1:\([0-9]*\), ready.*|\1|p' "$log")
    [ -n "$port" ] && return 0
    kill -0 $serve_pid 2>/dev/null || { cat "$log"; echo "serve exited before it was ready"; exit 1; }
    sleep 0.1
  done
  cat "$log"
  echo "serve was not ready in 60 s"
  exit 1
}
