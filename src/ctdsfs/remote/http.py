"""Plain HTTP(S) objects for ``remote.store``: a HEAD for the version, ranged GETs pinned
by If-Match (or the date), every answer checked exactly and under a total deadline."""

import http.client
from email.utils import parsedate_to_datetime

from .wire import (
    DATE_PIN,
    DEADLINES,
    ObjectMissing,
    ObjectReplaced,
    ObjectVersion,
    RemoteError,
    TransientFailure,
    answer_bytes,
    capped_response_class,
    check_body,
    check_head,
    check_range,
    deadline,
    parsed_size,
)


def timed_pool_classes(pools):
    """Subclasses of urllib3 pool classes (``{scheme: class}``) whose connections register
    each request with DEADLINES (which may then cut the connection's socket) and read at
    most the bytes it allows of each answer (``DEADLINES.most_bytes``)."""

    def timed(pool_class):
        class TimedConnection(pool_class.ConnectionCls):
            def request(self, *args, **kwargs):
                DEADLINES.attach(self)
                return super().request(*args, **kwargs)

            def getresponse(self, *args, **kwargs):
                plain = self.response_class  # (botocore's may change between requests)
                self.response_class = capped_response_class(plain, DEADLINES.most_bytes())
                try:
                    return super().getresponse(*args, **kwargs)
                finally:
                    self.response_class = plain
        return type(f"Timed{pool_class.__name__}", (pool_class,),
                    {"ConnectionCls": TimedConnection})

    return {scheme: timed(pool_class) for scheme, pool_class in pools.items()}


class HTTPObject:
    """One object on a web server. Redirects are never followed (a redirect is refused:
    it could lead anywhere), bodies never decoded (``Accept-Encoding: identity``)."""

    def __init__(self, url, options):
        import urllib3

        self.url, self.options = url, options
        self._errors = (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException,
                        ValueError)
        self._tls_errors = urllib3.exceptions.SSLError  # a refused certificate: no retry
        self._pool = urllib3.PoolManager(
            maxsize=options.concurrency + 2, retries=False, block=False,
            timeout=urllib3.Timeout(connect=options.timeout, read=options.timeout))
        self._pool.pool_classes_by_scheme = timed_pool_classes(self._pool.pool_classes_by_scheme)

    def _request(self, method, headers, limit):
        """``(response, body)``, the whole request within its deadline; never more of the
        body than ``limit`` + 1 bytes is read (one more tells a longer body)."""
        headers = dict(headers, **{"Accept-Encoding": "identity"})
        with DEADLINES.watching(deadline(self.options, limit), answer_bytes(limit)):
            try:
                r = self._pool.request(method, self.url, headers=headers,
                                       preload_content=False, redirect=False)
                try:
                    body = r.read(limit + 1, decode_content=False) if limit else b""
                finally:
                    if r.length_remaining != 0:  # more, or an unknown length: not reusable
                        r.close()
                    r.release_conn()
            except self._tls_errors as exc:
                raise RemoteError(f"{self.url}: TLS: {exc}", f"TLS: {exc}") from None
            except self._errors as exc:
                raise TransientFailure(str(exc)[:200] or type(exc).__name__) from None
        if r.status in (404, 410):
            raise ObjectMissing()
        if r.status == 412:
            raise ObjectReplaced()
        if r.status >= 500 or r.status == 429:
            raise TransientFailure(f"HTTP {r.status}")
        if r.status not in (200, 206):
            raise RemoteError(f"{self.url}: HTTP {r.status} {r.reason}", f"HTTP {r.status}")
        return r, body

    def head(self):
        """The version: its ETag, else its Last-Modified date (with its size); a server
        sending neither cannot tell versions apart, so its objects are refused."""
        r, _ = self._request("HEAD", {}, 0)
        check_head(r.status, r.headers.get)
        modified = r.headers.get("Last-Modified")
        try:
            mtime = parsedate_to_datetime(modified).timestamp() if modified else 0.0
        except (TypeError, ValueError):
            mtime = 0.0
        etag = r.headers.get("ETag") or (modified and DATE_PIN + modified)
        if not etag:
            raise RemoteError(f"{self.url}: the server sends neither ETag nor Last-Modified, "
                              "so a replaced object could serve mixed bytes: refused")
        return ObjectVersion(parsed_size(r.headers.get("Content-Length"), self.url), etag, mtime)

    def get(self, start, end, version):
        """Bytes ``start`` to ``end`` of ``version``: asked for under its ETag (If-Match)
        or date (If-Unmodified-Since), and checked against the answer's ETag, or its
        Last-Modified and total size, for servers ignoring those conditions; then the
        range itself (``check_range``)."""
        headers = {"Range": f"bytes={start}-{end - 1}"}
        by_date = version.etag.startswith(DATE_PIN)
        if by_date:
            headers["If-Unmodified-Since"] = version.etag[len(DATE_PIN):]
        elif not version.etag.startswith("W/"):  # If-Match compares strongly: never weak
            headers["If-Match"] = version.etag
        r, body = self._request("GET", headers, end - start)
        if by_date:
            total = r.headers.get("Content-Range", "").rpartition("/")[2]
            if r.headers.get("Last-Modified") != version.etag[len(DATE_PIN):] \
                    or total not in ("", "*", str(version.size)):
                raise ObjectReplaced()
        elif r.headers.get("ETag") not in (None, version.etag):
            raise ObjectReplaced()
        check_range(r.status, r.headers.get, start, end, version.size)
        return check_body(body, start, end)

    def close(self):
        self._pool.clear()
