"""An S3-compatible object store on one fake host (tests/hosts/harness.py): moto's standalone
server (``moto_server -H <host address> -p <port>``, what s3fs's own tests use), one bucket,
fake credentials. ``hand_to`` gives a host the endpoint and credentials the way a cluster
admin would: ``~/.aws/config`` and ``~/.aws/credentials`` (0600) in the home of the user
Ray runs as, which botocore (under s3fs, under fsspec) reads in every process there, Ray's
workers included. A host not handed them, or with no route to the endpoint, does not reach
the store. Stopped by its PID, checked gone (``stop``); the data lives in the server's
memory and goes with it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time

from tests.hosts.harness import HOME, Hosts
from tests.hosts.ray_cluster import VENV_BIN

S3_PORT = 9000
BUCKET = "raylight"
_MAKE_BUCKET = (
    "import boto3,sys,time\n"
    "c=boto3.client('s3'); end=time.monotonic()+float(sys.argv[2])\n"
    "while True:\n"
    "    try: c.create_bucket(Bucket=sys.argv[1]); break\n"
    "    except Exception:\n"
    "        if time.monotonic() > end: raise\n"
    "        time.sleep(0.2)\n"
)
# every object under the bucket, as {key: text} (what a run left in the store)
_DUMP = (
    "import fsspec,json,sys\n"
    "fs=fsspec.filesystem('s3'); out={}\n"
    "for key in fs.find(sys.argv[1]):\n"
    "    with fs.open(key,'rb') as f: out[key]=f.read().decode('latin-1')\n"
    "print(json.dumps(out))"
)


class S3OnHost:
    """``S3OnHost(hosts, "s")``: the server on host s, its bucket made; ``uri(path)`` names
    a place in it."""

    def __init__(self, hosts: Hosts, host: str, port: int = S3_PORT, bucket: str = BUCKET, timeout: float = 120):
        self.hosts, self.host, self.bucket = hosts, host, bucket
        self.address = hosts.address(host)
        self.port = port
        self.endpoint = f"http://{self.address}:{port}"
        # fake, but shaped like AWS's; each run its own, so a test can look for the secret
        self.key_id = "AKIA" + secrets.token_hex(8).upper()
        self.secret = secrets.token_urlsafe(30)
        self.log_path = os.path.join(hosts.shared, f"moto-{host}.log")
        log = open(self.log_path, "w")  # noqa: SIM115 - open while the server runs
        cmd = [os.path.join(VENV_BIN, "moto_server"), "-H", self.address, "-p", str(port)]
        self.proc = hosts.popen(host, cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_listening(timeout)
        self.hand_to(host)
        self.run(host, [sys.executable, "-c", _MAKE_BUCKET, bucket, str(timeout)], timeout=timeout + 30)

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path.lstrip('/')}"

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (self.address, self.port) not in self.hosts.listening(self.host):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server on host {self.host} is not listening:\n{self._log()[-3000:]}")
            time.sleep(0.2)

    def _log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def hand_to(self, *names: str) -> None:
        """The endpoint and credentials in each host's ``~/.aws`` (its home is in its private
        /tmp: written through its holder's root)."""
        for name in names:
            aws = f"/proc/{self.hosts.hosts[name].holder.pid}/root{HOME}/.aws"
            os.makedirs(aws, mode=0o700, exist_ok=True)
            files = {
                "config": f"[default]\nregion = us-east-1\nendpoint_url = {self.endpoint}\n",
                "credentials": f"[default]\naws_access_key_id = {self.key_id}\naws_secret_access_key = {self.secret}\n",
            }
            for file, text in files.items():
                fd = os.open(os.path.join(aws, file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)

    def run(self, host: str, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return self.hosts.run(host, cmd, timeout=timeout)

    def objects(self, host: str | None = None) -> dict[str, str]:
        """Every object in the bucket and its bytes (as latin-1 text), read from ``host``."""
        done = self.run(host or self.host, [sys.executable, "-c", _DUMP, self.bucket], timeout=120)
        return json.loads(done.stdout.splitlines()[-1])

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after 10 s); raises if the server or its port is left."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if (self.address, self.port) in self.hosts.listening(self.host):
            raise RuntimeError(f"moto_server's port {self.port} on host {self.host} is still open after its stop")


def files_holding(hosts: Hosts, text: str, skip: tuple[str, ...] = (f"{HOME}/.aws",)) -> list[str]:
    """Every file under each host's private /tmp (and the shared directory) that holds
    ``text``, the admin's ``~/.aws`` left out: where a secret must not be."""
    roots = {f"host {name}": f"/proc/{h.holder.pid}/root/tmp" for name, h in hosts.hosts.items()}
    roots["shared"] = hosts.shared
    needle = text.encode()
    found = []
    for label, root in roots.items():
        inner = f"/proc/{hosts.hosts[label[5:]].holder.pid}/root" if label.startswith("host ") else ""
        for folder, dirs, files in os.walk(root):
            if any((folder[len(inner):] + "/").startswith(s + "/") for s in skip):
                dirs[:] = []
                continue
            for file in files:
                path = os.path.join(folder, file)
                try:
                    if not os.path.isfile(path) or os.path.getsize(path) > 64 * 1024**2:
                        continue
                    with open(path, "rb") as f:
                        if needle in f.read():
                            found.append(f"{label}: {path[len(inner):]}")
                except OSError:
                    continue
    return found
