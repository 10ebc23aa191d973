#!/usr/bin/env python3
"""Captures the JSON schemas real agent clients send (issue 38's corpus): each pinned client
(scripts/agent-clients.sh; the OpenAI Agents SDK of scripts/npm-client.sh, driven by
capture_agents_sdk.cjs) is pointed at a loopback server that records its first request and
answers 503, and the schemas in that request (tools' input_schema / parameters, a structured
output format) are written to bench/grammar/corpus/<client>-<version>.json with their source.

    bench/grammar/capture_schemas.py [--out DIR]

Telemetry, error reports and update checks are off by the clients' own variables; nothing leaves
loopback (the clients' base URLs are the capture server's)."""
import argparse
import http.server
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Capture(http.server.BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        try:
            Capture.requests.append((self.path, json.loads(body)))
        except ValueError:
            pass
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": {"type": "overloaded_error", "message": "captured"}}')

    def do_GET(self):
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def serve():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def clients_dir():
    out = subprocess.run([str(ROOT / "scripts/agent-clients.sh")], check=True,
                         capture_output=True, text=True).stdout
    return pathlib.Path(out.strip().splitlines()[-1])


def version(clients, package):
    return json.load(open(clients / "node_modules" / package / "package.json"))["version"]


def run_claude(clients, port, home):
    env = dict(os.environ, HOME=home, ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
               ANTHROPIC_API_KEY="sk-capture", DISABLE_TELEMETRY="1",
               DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CODE_MAX_RETRIES="0")
    subprocess.run([str(clients / "node_modules/.bin/claude"), "-p", "Say hello",
                    "--output-format", "json"], env=env, cwd=home, capture_output=True,
                   timeout=300)


def run_codex(clients, port, home):
    pathlib.Path(home, "config.toml").write_text(f"""model = "capture"
model_provider = "capture"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.capture]
name = "capture"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "CAPTURE_KEY"
request_max_retries = 0
stream_max_retries = 0
""")
    env = dict(os.environ, HOME=home, CODEX_HOME=home, CAPTURE_KEY="sk-capture")
    subprocess.run([str(clients / "node_modules/.bin/codex"), "exec", "--skip-git-repo-check",
                    "Say hello"], env=env, cwd=home, capture_output=True, timeout=300)


def agents_sdk_dir():
    out = subprocess.run([str(ROOT / "scripts/npm-client.sh"), "agents-sdk"], check=True,
                         capture_output=True, text=True).stdout
    return pathlib.Path(out.strip().splitlines()[-1])


def run_agents_sdk(packages, port, home):
    env = dict(os.environ, HOME=home, OPENAI_AGENTS_DISABLE_TRACING="1")
    subprocess.run(["node", str(ROOT / "bench/grammar/capture_agents_sdk.cjs"), str(packages),
                    f"http://127.0.0.1:{port}/v1"], env=env, cwd=home, capture_output=True,
                   timeout=300)


def schemas_of(path, body):
    """(name, schema) pairs of one request: Anthropic Messages tools, Responses or Chat
    Completions function tools, and a structured output format."""
    out = []
    for tool in body.get("tools", []):
        if "input_schema" in tool:
            out.append((tool["name"], tool["input_schema"]))
        elif tool.get("type") == "function" and "parameters" in tool:
            out.append((tool["name"], tool["parameters"]))
        elif tool.get("type") == "function" and "function" in tool:
            out.append((tool["function"]["name"], tool["function"].get("parameters", {})))
    fmt = body.get("text", {}).get("format", {})
    if fmt.get("type") == "json_schema":
        out.append((fmt.get("name", "output"), fmt["schema"]))
    rf = body.get("response_format", {})
    if rf.get("type") == "json_schema":
        out.append((rf["json_schema"].get("name", "output"), rf["json_schema"]["schema"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/grammar/corpus"))
    args = ap.parse_args()
    clients = clients_dir()
    sdk = agents_sdk_dir()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, package, run, where in (
            ("claude-code", "@anthropic-ai/claude-code", run_claude, clients),
            ("codex", "@openai/codex", run_codex, clients),
            ("openai-agents", "@openai/agents", run_agents_sdk, sdk)):
        Capture.requests = []
        server = serve()
        with tempfile.TemporaryDirectory() as home:
            run(where, server.server_address[1], home)
        server.shutdown()
        seen, schemas = set(), []
        for path, body in Capture.requests:
            for tool, schema in schemas_of(path, body):
                key = json.dumps([tool, schema], sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    schemas.append({"name": tool, "route": path, "schema": schema})
        if not schemas:
            sys.exit(f"{name}: no schema captured ({len(Capture.requests)} requests)")
        v = version(where, package)
        file = out / f"{name}-{v}.json"
        json.dump({"source": f"{package}@{v}, its first requests to a loopback server "
                             f"(bench/grammar/capture_schemas.py)",
                   "schemas": schemas}, open(file, "w"), indent=1)  # the client's own key order
        print(f"{file.relative_to(ROOT)}: {len(schemas)} schemas from "
              f"{len(Capture.requests)} requests")


if __name__ == "__main__":
    main()
