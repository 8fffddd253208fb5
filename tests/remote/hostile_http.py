"""A small HTTP server on loopback that serves one object and misbehaves in one way (its
``mode``), the way object stores and proxies in the wild do. Threads; ``close()`` ends
every connection it holds (the tests call it in a finalizer).

A mode's misbehaviour applies to ranged GETs, and to HEADs too where the mode is about
the answer itself (slow headers, redirects, huge headers, no validators). The error-body
modes answer every GET (an S3 listing too) with an error whose body is huge or endless;
the listing modes answer an S3 listing (a GET without a Range), and ranged GETs well;
other modes answer a listing well (the one object). With ``everything``, every mode
answers a HEAD and a listing too, as it would a GET of the whole object (so a
revalidation fails in that mode's way). The stall modes answer up to one phase of the
answer and then hold the connection: before the status line, after the headers, or
between the chunks of a chunked body (``slow-headers``, ``trickled-body`` and
``half-body-held`` stall in the other phases)."""

import functools
import re
import socket
import struct
import threading
import urllib.parse
import zlib

ETAG = '"hostile-1"'
MODIFIED = "Mon, 02 Jan 2023 03:04:05 GMT"
HEAD_MODES = {"slow-headers", "redirect-port", "redirect-self", "redirect-file",
              "redirect-unresolvable", "huge-headers", "no-validators", "many-headers",
              "long-headers"}
ERROR_MODES = {"huge-error-body", "endless-error-body", "endless-chunk-size"}
LISTING_MODES = {"huge-listing", "endless-listing"}
STALL_MODES = {"stall-before-status", "slow-headers", "stall-after-headers", "trickled-body",
               "half-body-held", "stall-between-chunks"}
MODES = {"honest", "wrong-range", "shifted-range", "wrong-total", "gzip-bomb", "ignored-range",
         "503", "reset", "etag-flips", "longer-body", "endless-body", "endless-chunked"} \
    | STALL_MODES | HEAD_MODES | ERROR_MODES | LISTING_MODES
BOMB = 16 << 20  # bytes a gzip-bomb body inflates to
HUGE = 256 << 20  # bytes of a huge error body or listing
# a trickled answer's pause between bytes: well under the tests' 1 s socket timeout, so
# what ends it is the request's whole deadline, never the socket's read timeout
TRICKLE_SECONDS = 0.25
LISTING_HEAD = (b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns='
                b'"http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix></Prefix>'
                b'<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>')
LISTING_ENTRY = (b'<Contents><Key>object.mf</Key><LastModified>2023-01-02T03:04:05.000Z'
                 b'</LastModified><ETag>&quot;hostile-1&quot;</ETag><Size>1</Size></Contents>')


@functools.cache
def _gzip_bomb():
    """A gzip member of BOMB zero bytes (about 70 KiB), made once."""
    squeeze = zlib.compressobj(1, zlib.DEFLATED, 31)  # (31: with the gzip header and trailer)
    zeros = bytes(1 << 20)
    return b"".join(squeeze.compress(zeros) for _ in range(BOMB >> 20)) + squeeze.flush()


class HostileServer:
    """``data`` at ``url()``, misbehaving as ``mode`` says (MODES), except to GETs of a
    range starting below ``honest_below`` (where a container's header lies)."""

    def __init__(self, data, mode, other_port=None, honest_below=0, everything=False,
                 keys=("object.mf",), misbehaving=None):
        assert mode in MODES, mode
        self.data, self.mode, self.other_port = data, mode, other_port
        self.keys = keys  # the bucket's objects (each one holds ``data``), as S3 lists them
        # the requests that misbehave: those whose target holds one of these strings (an
        # object's path, "prefix=sub" for a sub-prefix's listing; None: all of them)
        self.misbehaving = misbehaving
        self.everything = everything  # HEADs and listings misbehave too
        self.honest_below = honest_below  # GETs starting below it are answered well
        self.requests = []  # (method, {header: value}) of each request seen
        self._closing = threading.Event()
        self._connections = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flips = 0
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def url(self, name="object.mf"):
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self):
        self._closing.set()
        try:  # (wakes the accept: closing alone leaves the thread in it, listening)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._acceptor.join(10)
        self._listener.close()
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()

    # ------------------------------------------------------------ serving

    def _accept(self):
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buffer = b""
        try:
            while not self._closing.is_set():
                while b"\r\n\r\n" not in buffer:
                    more = conn.recv(65536)
                    if not more or len(buffer) > 1 << 20:
                        return
                    buffer += more
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target = (lines[0].split(" ") + [""])[:2]
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:])}
                self.requests.append((method, headers))
                if not self._answer(conn, method, headers, target):
                    return
        except OSError:
            pass
        finally:
            conn.close()

    def _send(self, conn, status, headers, body=b""):
        text = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        conn.sendall(text.encode("latin-1") + body)

    def _hold(self, seconds=60):
        self._closing.wait(seconds)

    def _answer(self, conn, method, headers, target):
        """Answer one request; False: the connection is done with."""
        mode, data, size = self.mode, self.data, len(self.data)
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", headers.get("range", ""))
        if match and int(match[1]) < self.honest_below or self.misbehaving is not None \
                and not any(part in target for part in self.misbehaving):
            mode = "honest"
        if self.everything and mode != "honest" and (method == "HEAD" or not match) \
                and mode not in HEAD_MODES | ERROR_MODES | LISTING_MODES:
            method, match = "GET", re.fullmatch(r"bytes=(\d+)-(\d+)", f"bytes=0-{size - 1}")
        validators = [] if mode == "no-validators" else [("ETag", self._etag(mode)),
                                                          ("Last-Modified", MODIFIED)]
        if mode in HEAD_MODES or method == "GET":
            if mode.startswith("redirect-"):
                target = {"redirect-port": f"http://127.0.0.1:{self.other_port}/object.mf",
                          "redirect-self": self.url(),
                          "redirect-file": "file:///etc/passwd",
                          "redirect-unresolvable": "http://no-such-host.invalid/object.mf"}
                self._send(conn, "302 Found", [("Location", target[mode]),
                                               ("Content-Length", "0")])
                return True
            if mode == "slow-headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for i in range(120):
                    if self._closing.wait(TRICKLE_SECONDS):
                        return False
                    conn.sendall(f"X-Slow-{i}: {i}\r\n".encode())
                return False
            if mode == "huge-headers":
                self._send(conn, "200 OK", [("X-Huge", "x" * (1 << 20))] + validators)
                return False
            if mode == "many-headers":
                self._send(conn, "200 OK", [(f"X-Many-{i}", "x") for i in range(5000)])
                return False
            if mode == "long-headers":  # each one, and their number, within http.client's
                self._send(conn, "200 OK", [("Content-Length", str(size))] + validators
                           + [(f"X-Long-{i}", "x" * 60000) for i in range(90)])
                return method == "HEAD"
        if method == "GET" and mode in ERROR_MODES:
            return self._error_body(conn, mode)
        if method == "GET" and not match and mode in LISTING_MODES:
            return self._listing(conn, mode)
        if method == "HEAD":
            self._send(conn, "200 OK", [("Content-Length", str(size)),
                                        ("Accept-Ranges", "bytes")] + validators)
            return True
        if method == "GET" and not match:
            body = self._listed(target, size)
            self._send(conn, "200 OK", [("Content-Length", str(len(body)))], body)
            return True
        if method != "GET":
            self._send(conn, "400 Bad Request", [("Content-Length", "0")])
            return True
        start, end = int(match[1]), min(int(match[2]) + 1, size)
        length = end - start
        if mode == "stall-before-status":
            self._hold()
            return False
        if mode == "503":
            self._send(conn, "503 Service Unavailable", [("Content-Length", "0")])
            return True
        if mode == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if mode == "ignored-range":
            self._send(conn, "200 OK", [("Content-Length", str(size))] + validators, data)
            return True
        if mode in ("wrong-range", "shifted-range"):
            shift = length if mode == "wrong-range" else 7
            if end + shift > size:
                shift = -shift
            start, end = start + shift, end + shift
        if mode == "gzip-bomb":
            bomb = _gzip_bomb()
            self._send(conn, "206 Partial Content",
                       [("Content-Range", f"bytes {start}-{end - 1}/{size}"),
                        ("Content-Encoding", "gzip"), ("Content-Length", str(len(bomb)))]
                       + validators, bomb)
            return True
        total = size + 1 if mode == "wrong-total" else size
        ranged = [("Content-Range", f"bytes {start}-{end - 1}/{total}")] + validators
        body = data[start:end]
        if mode in ("endless-body", "endless-chunked"):
            chunked = mode == "endless-chunked"
            self._send(conn, "206 Partial Content",
                       ranged + ([("Transfer-Encoding", "chunked")] if chunked
                                 else [("Connection", "close")]))
            piece = b"\0" * 65536
            frame = b"10000\r\n" + piece + b"\r\n" if chunked else piece
            while not self._closing.is_set():
                conn.sendall(frame)
            return False
        if mode == "stall-between-chunks":
            self._send(conn, "206 Partial Content",
                       ranged + [("Transfer-Encoding", "chunked")],
                       b"%x\r\n" % (length // 2) + body[:length // 2] + b"\r\n")
            self._hold()
            return False
        if mode == "longer-body":  # a Content-Length that fits, more bytes than it says
            self._send(conn, "206 Partial Content",
                       ranged + [("Transfer-Encoding", "chunked")],
                       b"%x\r\n" % (length + 100) + data[start:end] + bytes(100)
                       + b"\r\n0\r\n\r\n")
            return True
        self._send(conn, "206 Partial Content",
                   ranged + [("Content-Length", str(len(body)))],
                   b"" if mode in ("trickled-body", "half-body-held", "stall-after-headers")
                   else body)
        if mode == "trickled-body":
            for byte in body:
                if self._closing.wait(TRICKLE_SECONDS):
                    return False
                conn.sendall(bytes([byte]))
        elif mode == "stall-after-headers":
            self._hold()
            return False
        elif mode == "half-body-held":
            conn.sendall(body[:len(body) // 2])
            self._hold()
            return False
        return True

    def _listed(self, target, size):
        """The listing of the prefix a LIST names: the keys under it, one level deep (S3's
        "/" delimiter), deeper ones as common prefixes."""
        prefix = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get(
            "prefix", [""])[0]
        below = [key[len(prefix):] for key in self.keys if key.startswith(prefix)]
        folders = sorted({name.split("/")[0] for name in below if "/" in name})
        return (LISTING_HEAD.replace(b"<Prefix></Prefix>", b"<Prefix>%s</Prefix>" % prefix.encode())
                + b"".join(LISTING_ENTRY.replace(b"object.mf", (prefix + name).encode())
                           .replace(b"<Size>1<", b"<Size>%d<" % size)
                           for name in below if "/" not in name)
                + b"".join(b"<CommonPrefixes><Prefix>%s/</Prefix></CommonPrefixes>"
                           % (prefix + folder).encode() for folder in folders)
                + b"<IsTruncated>false</IsTruncated></ListBucketResult>")

    def _error_body(self, conn, mode):
        """A 500 whose body is HUGE bytes long, endless, or whose chunk-size line is."""
        if mode == "huge-error-body":
            self._send(conn, "500 Internal Server Error", [("Content-Length", str(HUGE))])
            frame = b"<Error>" + b"x" * ((1 << 20) - 7)
            for _ in range(HUGE >> 20):
                conn.sendall(frame)
            return True
        self._send(conn, "500 Internal Server Error", [("Transfer-Encoding", "chunked")],
                   b"" if mode == "endless-error-body" else b"1")
        frame = b"10000\r\n" + b"x" * 65536 + b"\r\n" if mode == "endless-error-body" \
            else b"0" * 65536
        while not self._closing.is_set():
            conn.sendall(frame)
        return False

    def _listing(self, conn, mode):
        """A listing page HUGE bytes long, or pages that go on for ever (each one truncated,
        naming another continuation token, with the same key again)."""
        if mode == "endless-listing":
            self._flips += 1
            body = (LISTING_HEAD + b"<IsTruncated>true</IsTruncated><NextContinuationToken>"
                    + b"next-%d</NextContinuationToken><KeyCount>1</KeyCount>" % self._flips
                    + LISTING_ENTRY + b"</ListBucketResult>")
            self._send(conn, "200 OK", [("Content-Length", str(len(body)))], body)
            return True
        frame = LISTING_ENTRY * ((1 << 20) // len(LISTING_ENTRY))
        count = HUGE // len(frame)
        tail = b"<IsTruncated>false</IsTruncated></ListBucketResult>"
        self._send(conn, "200 OK",
                   [("Content-Length", str(len(LISTING_HEAD) + count * len(frame) + len(tail)))],
                   LISTING_HEAD)
        for _ in range(count):
            conn.sendall(frame)
        conn.sendall(tail)
        return True

    def _etag(self, mode):
        if mode != "etag-flips":
            return ETAG
        self._flips += 1
        return f'"hostile-{self._flips}"'
