"""A real OpenSSH server on 127.0.0.1 with its own keys and known_hosts (tests and bench).

It runs as the current user with a generated host key and a generated user key; nothing
of the developer's ~/.ssh is read. ``running_sshd`` starts it on a free port and stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.nodes.ssh.dispatcher import SSHDispatcher

# PREFLIGHT_SSHD when set (a machine where sshd lies elsewhere), else on PATH, else /usr/sbin
SSHD = os.environ.get("PREFLIGHT_SSHD") or shutil.which("sshd") or "/usr/sbin/sshd"
SFTP_SERVER = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                                "/usr/lib/ssh/sftp-server") if os.path.exists(p)), "internal-sftp")
FAKE_RUNNER = Path(__file__).resolve().parent / "fakerunner" / "runner"
# A bare interpreter: the base installation behind the virtualenv, standard library only.
BARE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


def missing() -> str | None:
    """What this machine lacks to start a test sshd, named with how to install it (one line,
    no parentheses: a bench puts it in its verdict line), or None."""
    if not (os.path.isfile(SSHD) and os.access(SSHD, os.X_OK)):
        return f"sshd not found at {SSHD}, install openssh-server with make system-deps"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not found on PATH, install openssh-client with make system-deps"
    return None


@dataclass
class Sshd:
    port: int
    root: Path
    host_key: Path
    user_key: Path
    known_hosts: Path
    proc: subprocess.Popen[bytes]

    @property
    def user(self) -> str:
        import getpass

        return getpass.getuser()

    @property
    def lease_key(self) -> str:
        """The node's lease key: a port other than 22 is part of it."""
        return f"127.0.0.1:{self.port}"

    def fingerprint(self) -> str:
        out = subprocess.run(["ssh-keygen", "-lf", f"{self.host_key}.pub"], check=True,
                             capture_output=True, text=True).stdout
        return out.split()[1]

    def dispatcher(self, cls: type[SSHDispatcher] = SSHDispatcher, **kw: Any) -> SSHDispatcher:
        """A dispatcher (or ``cls``, a fault-injecting subclass) that trusts only this sshd."""
        options: dict[str, Any] = {"known_hosts": self.known_hosts, "client_keys": [self.user_key],
                                   "use_agent": False, "runner_package": FAKE_RUNNER,
                                   "backoff": (0.05, 0.5)}
        options.update(kw)
        return cls(**options)

    def node(self, workdir: Path, **kw: Any) -> dict[str, Any]:
        return {"kind": "ssh", "host": "127.0.0.1", "port": self.port, "user": self.user,
                "workdir": str(workdir), "python": BARE_PYTHON, **kw}

    def kill_connections(self) -> int:
        """SIGKILL every per-connection sshd process: each client connection drops."""
        killed = 0
        for pid in _children(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed


def _children(ppid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == ppid:
            out.append(int(entry))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "preflight-test",
                    "-f", str(path)], check=True)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)  # the sshd process is not ours to block on; poll with a deadline
    raise RuntimeError(f"sshd did not listen on {port}: {log.read_text()[-2000:]}")


@contextmanager
def running_sshd(root: Path) -> Iterator[Sshd]:
    root.mkdir(parents=True, exist_ok=True)
    host_key, user_key = root / "host_ed25519", root / "user_ed25519"
    _keygen(host_key)
    _keygen(user_key)
    (root / "authorized_keys").write_text((root / "user_ed25519.pub").read_text())
    os.chmod(root / "authorized_keys", 0o600)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
    last_error = ""
    for _ in range(5):
        port = _free_port()
        config = root / "sshd_config"
        config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin yes
StrictModes no
PrintMotd no
MaxStartups 50
MaxSessions 50
Subsystem sftp {SFTP_SERVER}
LogLevel ERROR
""")
        log = root / "sshd.log"
        with open(log, "ab") as logfh:
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=logfh,
                                    stderr=subprocess.STDOUT)
        try:
            _wait_listening(port, proc, log)
        except RuntimeError as exc:
            last_error = str(exc)
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            continue
        pub = (root / "host_ed25519.pub").read_text().split()
        known = root / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
        server = Sshd(port, root, host_key, user_key, known, proc)
        try:
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return
    raise RuntimeError(f"could not start sshd: {last_error}")
