#!/usr/bin/env bash
# kstate_await_ready (scripts/lib.sh), which scripts/demo uses to wait for the
# instances it starts, with every launch held between fork and exec.
#
# strace holds each launch's execve of nohup for a few seconds, as a loaded machine may:
# meanwhile the launched child still runs the shell's image. A wait that took that for
# a dead kstate (the demo once did, reading /proc/PID/cmdline) fails the first case.
#   1. a stand-in server answering /readyz 200: the wait returns 0;
#   2. a stand-in that exits with status 3 before it is ready: the wait returns 1 and
#      says so with the exit status and the tail of its log.
# Needs strace and python3 (scripts/setup installs them) and curl.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v strace >/dev/null || fail "strace is not installed (scripts/setup installs it)"
nohup_path=$(command -v nohup) || fail "nohup is not installed"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The stand-in for kstate: answers GET /readyz with 200 on the port it is given.
cat >"$work/fake_kstate.py" <<'PY'
import http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

print("stand-in listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
PY

# The cases, run by a shell that strace follows: the launches are its children.
cat >"$work/cases.sh" <<'SH'
set -euo pipefail
root=$1 work=$2 port=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$root/scripts/lib.sh"

nohup python3 "$work/fake_kstate.py" "$port" >"$work/ready.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
kstate_await_ready "$pid" "http://127.0.0.1:$port/readyz" "$work/ready.log" 120 ||
  fail "case 1: a running stand-in was not waited for"
kill "$pid"
wait "$pid" || true

nohup python3 -c 'import sys; print("stand-in: bad configuration"); sys.exit(3)' >"$work/exits.log" 2>&1 &
pid=$!
if kstate_await_ready "$pid" "http://127.0.0.1:$port/readyz" "$work/exits.log" 120 2>"$work/exits.err"; then
  fail "case 2: a stand-in that exited was reported ready"
fi
grep -q "exited with status 3 before it was ready" "$work/exits.err" ||
  fail "case 2: the exit status is not reported: $(cat "$work/exits.err")"
grep -q "stand-in: bad configuration" "$work/exits.err" ||
  fail "case 2: the log's tail is not shown: $(cat "$work/exits.err")"
echo "cases passed"
SH

# A port nobody listens on now (case 2 must not find a server there either).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Only execve of nohup is traced (seccomp-bpf keeps everything else at full speed), and
# each is held 3 s on entry, before the child has become nohup, let alone the server.
strace -f --seccomp-bpf -qq -e signal=none -o "$work/strace.log" -P "$nohup_path" -e trace=execve \
  -e inject=execve:delay_enter=3000000 bash "$work/cases.sh" "$root" "$work" "$port"

# The test proves something only if both launches were in fact held.
held=$(grep -c 'execve.*(DELAYED)$' "$work/strace.log" || true)
[ "$held" = 2 ] || fail "expected both launches held before exec, strace held $held:
$(cat "$work/strace.log")"
echo "PASS: both launches held 3 s before exec; the wait followed the running one and reported the one that exited"
