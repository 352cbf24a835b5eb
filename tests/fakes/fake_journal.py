"""A fake systemd-journald socket: receives sd_journal_send() datagrams.

Usage (inside a private mount namespace with a tmpfs on /run, so the real
journal is never touched):
  fake_journal.py SOCKET OUT.json -- COMMAND ARGS...
binds SOCKET (AF_UNIX, SOCK_DGRAM, as /run/systemd/journal/socket), runs
COMMAND, then writes every entry received (a dict of field -> value) to
OUT.json and exits with COMMAND's status.

Implements the native protocol's two field forms: "KEY=value\n", and
"KEY\n" + 64-bit little-endian length + value + "\n" for values with
newlines. Not implemented: entries passed as a memfd (journald's path for
datagrams too large for the socket; spotvisor's are small), the stdout
stream socket, syslog.
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading


def parse(datagram):
    fields = {}
    i = 0
    while i < len(datagram):
        nl = datagram.index(b"\n", i)
        line = datagram[i:nl]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = nl + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", datagram[nl + 1:nl + 9])
            value = datagram[nl + 9:nl + 9 + size]
            i = nl + 9 + size + 1
        fields[key.decode()] = value.decode("utf-8", "replace")
    return fields


def main():
    sock_path, out_path = sys.argv[1], sys.argv[2]
    command = sys.argv[sys.argv.index("--") + 1:]
    os.makedirs(os.path.dirname(sock_path), exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    entries = []
    done = threading.Event()

    def receive():
        sock.settimeout(0.2)
        while not done.is_set():
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                continue
            entries.append(parse(data))

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    code = subprocess.call(command)
    done.set()
    t.join()
    with open(out_path, "w") as f:
        json.dump(entries, f)
    sys.exit(code)


if __name__ == "__main__":
    main()
