"""A container's bytes on object storage (``s3://``) or a web server (``http(s)://``).

A :class:`RemoteStore` stands where a :class:`~ctdsfs.io.store.FileStore`
stands for a local file, read-only: ``pread`` becomes ranged GETs run by a small
thread pool (``concurrency``). A stream (a read starting where a recent one
ended) gets whole chunks (``chunk_size``), kept in a bounded memory cache
(``cache_size``; the header's chunk 0 always stays) and read ahead
(``readahead`` chunks) at once (from chunk 0, once it moves on into the next
chunk), so a FUSE read of 128 KiB costs no request of its own; a read that jumps into a chunk neither
cached nor being fetched GETs exactly its own bytes (a row range of a column
moves its rows' bytes, not 8 MiB), until a reader scattered over a chunk makes
it worth fetching whole (``WHOLE_AFTER``). Opening a container costs the GET of
its header's chunk and nothing more.

Libraries: botocore (synchronous) for S3, since it brings the whole AWS
configuration chain (``AWS_*`` variables, ``~/.aws/config`` and credentials,
profiles, ``AWS_ENDPOINT_URL``; in-process ``key``/``secret``/``token`` too)
and is what s3fs is built on; urllib3 for plain HTTP(S) (``remote_http``).
Throughput comes from the concurrent chunked GETs, not from the
client (README, "Containers on S3 and HTTP", has the figures).

Coherence: every GET carries ``If-Match`` with the ETag of the version being
served, and the answer's ETag is compared too (for servers that ignore
``If-Match``), so no read mixes bytes of two versions. An HTTP server without
ETags pins by Last-Modified and size instead; one sending neither is refused
(nothing would tell two versions apart). A replaced object fails
that read (EIO) and marks the store stale; the container's next reload check
(``replaced()``) switches to the new version, the way a local container
reloads when its header counter moved on.

Faults: every request has a ``timeout`` between bytes and a total deadline
(``remote_wire.deadline``: ``timeout`` plus ``timeout`` per MiB asked for),
after which its connection is cut; a failure (5xx, reset, timeout, a wrong
answer) is retried ``retries`` times with exponential backoff, then the read
fails with a :class:`RemoteError` (a BlockError: EIO for that read in a mount,
one line from a command). A user's request (a FUSE read, lookup or listing)
waits for all its GETs within one budget (``remote_retry``), and a chunk that
failed a moment ago fails again at once (FAILED_SECONDS). Nothing a server
answers is trusted (``remote_wire.check_range``, ``check_head``): a 206 must
name exactly the range asked for and the object's size, the body must be exactly that long (at most one byte more
is ever read), an encoded body is refused (``Accept-Encoding: identity``),
redirects are never followed, and no answer brings more bytes than its request
allows (``remote_wire.answer_bytes``, LIST_PAGE_MOST for a listing page), botocore's
whole-body reads of error bodies and listings included.
"""

import copy
import dataclasses
import io
import json
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from types import SimpleNamespace
from urllib.parse import urlsplit

from ..errors import CtdsfsError
from ..io.read_streams import ReadStreams
from .disk_cache import DiskCache
from .http import HTTPObject, timed_pool_classes
from .retry import OutOfTime, Revalidation, request_deadline, retried
from .schemes import REMOTE_SCHEMES
from .wire import (
    ANSWER_BYTES,
    DEADLINES,
    LIST_PAGE_MOST,
    ObjectMissing,
    ObjectReplaced,
    ObjectVersion,
    RemoteError,
    TransientFailure,
    answer_bytes,
    check_body,
    check_head,
    check_range,
    deadline,
    parsed_size,
)

log = logging.getLogger(__name__)

LIST_PAGE_BYTES = 1 << 20  # what a page of a listing may take as long as (its deadline;
# it may bring remote_wire.LIST_PAGE_MOST bytes)
LIST_IDLE_PAGES = 3  # pages in a row that bring no new name: the listing goes in circles
RECENT_ENDS = 8  # read ends remembered: a read starting at one carries on (a stream; several
# streams may take turns)
WHOLE_AFTER = 1  # scattered exact GETs into one chunk after which it is fetched whole (a
# reader dense there: a small GET's wait costs about a quarter of a whole chunk's)
NEAR = 1 << 20  # an exact read this close to the chunk's last one, not overlapping it, is
# the same reader's next piece (a row range's parts of its tiles) and does not count
EXACT_GETS_KEPT = 4096  # chunks whose exact GETs are counted (the oldest forgotten)
FAILED_SECONDS = 3.0  # a chunk whose GET failed this recently fails again at once: the
# kernel retries a failed read at once, and each retry would wait out the server again
FAILED_KEPT = 4096  # failed chunks remembered (the oldest forgotten)
WAIT_GRACE = 0.25  # seconds past a request's deadline its own GETs have to say why they failed


def is_remote(source):
    return isinstance(source, str) and source.startswith(REMOTE_SCHEMES)


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How a remote object is reached and cached (the mount's ``-o`` names)."""

    endpoint_url: str = None  # S3: another endpoint than AWS (default: AWS_ENDPOINT_URL)
    region: str = None  # S3: default from the AWS configuration
    profile: str = None  # S3: a profile of the AWS config files
    anon: bool = False  # S3: unsigned requests (public buckets)
    cache_size: int = 256 << 20  # bytes of chunks kept in memory
    chunk_size: int = 8 << 20  # bytes one GET fetches
    readahead: int = 8  # chunks fetched ahead of a sequential reader (all GETs busy)
    concurrency: int = 8  # GETs in flight
    retries: int = 3  # further attempts after a failed request
    timeout: float = 10.0  # seconds to connect, between bytes, and per request and MiB
    revalidate: float = 1.0  # seconds between checks for a replaced object
    cache_dir: str = None  # a directory of chunks that outlives the mount (DiskCache)
    cache_dir_size: int = 4 << 30  # bytes that directory may hold
    # S3 credentials handed over in-process (fsspec's convention, as s3fs takes them);
    # never mount options: a command line is seen by every local user
    key: str = dataclasses.field(default=None, repr=False)
    secret: str = dataclasses.field(default=None, repr=False)
    token: str = dataclasses.field(default=None, repr=False)


class _Redirected(Exception):
    """An S3 answer redirected elsewhere, without naming the bucket's region."""


class _S3:
    """S3 through botocore: the AWS credential chain, endpoint and region conventions."""

    def __init__(self, url, options):
        import botocore
        import botocore.config
        import botocore.exceptions
        import botocore.session

        logging.getLogger("botocore").setLevel(logging.WARNING)  # not "found credentials"
        parts = urlsplit(url)
        self.url, self.bucket, self.key = url, parts.netloc, parts.path.lstrip("/")
        if not self.bucket or not (self.key or url.endswith("/")):
            raise CtdsfsError(f"{url}: an s3:// source names a bucket and an object "
                              "(s3://BUCKET/KEY) or a prefix (s3://BUCKET/PREFIX/)")
        self._exc = botocore.exceptions
        try:
            session = botocore.session.Session(profile=options.profile)
            endpoint = options.endpoint_url or session.get_config_variable("endpoint_url") \
                or os.environ.get("AWS_ENDPOINT_URL_S3")
            config = botocore.config.Config(
                signature_version=botocore.UNSIGNED if options.anon else None,
                retries={"total_max_attempts": 1}, connect_timeout=options.timeout,
                read_timeout=options.timeout, max_pool_connections=options.concurrency + 2,
                s3={"addressing_style": "path" if endpoint else "auto"})
            given = {"aws_access_key_id": options.key, "aws_secret_access_key": options.secret,
                     "aws_session_token": options.token}
            self._client = session.create_client(
                "s3", endpoint_url=endpoint, config=config,
                region_name=options.region or session.get_config_variable("region")
                or "us-east-1", **{k: v for k, v in given.items() if v is not None})
        except self._exc.BotoCoreError as exc:  # a missing profile, a bad endpoint
            raise CtdsfsError(f"{url}: {exc}") from None
        # botocore asks a bucket redirected without its region for the region (HeadBucket),
        # and again at each redirect of that: a server redirecting everything recursed
        self._client.meta.events.register("before-call.s3.HeadBucket", self._no_region_lookup)
        sending = getattr(self._client._endpoint, "http_session", None)  # (no public way)
        pools = getattr(sending, "_pool_classes_by_scheme", None)
        if isinstance(pools, dict):  # its connections under DEADLINES, as HTTPObject's
            pools.update(timed_pool_classes(pools))
        self.options = options

    def _no_region_lookup(self, **kwargs):
        raise _Redirected(f"{self.url}: redirected elsewhere without a region: refused")

    def for_key(self, key):
        """The same bucket's object ``key``, through the same client (and connections)."""
        other = copy.copy(self)
        other.key, other.url = key, f"s3://{self.bucket}/{key}"
        return other

    def _call(self, method, **kwargs):
        try:
            return method(Bucket=self.bucket, **kwargs)
        except _Redirected as exc:
            raise RemoteError(str(exc), "redirected elsewhere: refused") from None
        except self._exc.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status == 404 or code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound"):
                raise ObjectMissing() from None
            if status == 412 or code == "PreconditionFailed":
                raise ObjectReplaced() from None
            if status >= 500 or status == 429 or code in ("SlowDown", "RequestTimeout"):
                raise TransientFailure(f"{code or status}") from None
            detail = f"{code or status}: {exc.response.get('Error', {}).get('Message', '')}"
            raise RemoteError(f"{self.url}: {detail}", detail) from None
        except self._exc.HTTPClientError as exc:  # (an answer too long, as botocore wraps it)
            failure = exc.kwargs.get("error")
            raise (failure if isinstance(failure, TransientFailure) else TransientFailure(str(exc))) \
                from None
        except (self._exc.NoCredentialsError, self._exc.PartialCredentialsError) as exc:
            raise CtdsfsError(f"{self.url}: {exc} (set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, a profile, or -o anon)") from None
        except (self._exc.BotoCoreError, OSError) as exc:  # timeouts, resets, refusals
            raise TransientFailure(str(exc) or type(exc).__name__) from None

    def head(self):
        with DEADLINES.watching(deadline(self.options, 0), ANSWER_BYTES):
            r = self._call(self._client.head_object, Key=self.key)
        headers = r.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        check_head(r.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                   lambda name: headers.get(name.lower()))
        if not r.get("ETag"):
            raise RemoteError(f"{self.url}: the server sends no ETag, so a replaced object "
                              "could serve mixed bytes: refused")
        modified = r.get("LastModified")
        return ObjectVersion(parsed_size(r.get("ContentLength"), self.url), r.get("ETag"),
                        modified.timestamp() if modified else 0.0)

    def get(self, start, end, version):
        """Bytes ``start`` to ``end`` of ``version`` (If-Match its ETag), the answer checked
        as an HTTP one is (``check_range``), all within the request's deadline."""
        kwargs = {"Range": f"bytes={start}-{end - 1}"}
        if version.etag:
            kwargs["IfMatch"] = version.etag
        asked = end - start
        with DEADLINES.watching(deadline(self.options, asked), answer_bytes(asked)):
            r = self._call(self._client.get_object, Key=self.key, **kwargs)
            try:
                if version.etag and r.get("ETag") not in (None, version.etag):
                    raise ObjectReplaced()
                headers = r.get("ResponseMetadata", {}).get("HTTPHeaders", {})
                check_range(r.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                            lambda name: headers.get(name.lower()), start, end, version.size)
                body = r["Body"].read(end - start + 1)  # botocore hands urllib3's buffer over
            except (self._exc.BotoCoreError, OSError, ValueError) as exc:
                raise TransientFailure(str(exc) or type(exc).__name__) from None
            finally:
                r["Body"].close()
        return check_body(body, start, end)

    def list(self, prefix, limit):
        """``({name: ObjectVersion}, {subdirectory names})`` directly under ``prefix`` (one
        level, as S3's "/" delimiter shows it); at most ``limit`` entries (True if cut
        there). Pages that bring no new name while saying more follow (a server going
        round in circles) fail the listing after LIST_IDLE_PAGES of them."""
        objects, prefixes, token, idle = {}, set(), None, 0
        while True:
            known = len(objects) + len(prefixes)
            more = {"ContinuationToken": token} if token else {}
            with DEADLINES.watching(deadline(self.options, LIST_PAGE_BYTES),
                                    ANSWER_BYTES + LIST_PAGE_MOST):
                r = self._call(self._client.list_objects_v2, Prefix=prefix, Delimiter="/",
                               MaxKeys=1000, **more)
            for item in r.get("Contents", []):
                modified = item.get("LastModified")
                objects[item["Key"][len(prefix):]] = ObjectVersion(
                    parsed_size(item.get("Size"), self.url), item.get("ETag"),
                    modified.timestamp() if modified else 0.0)
            for item in r.get("CommonPrefixes", []):
                prefixes.add(item["Prefix"][len(prefix):].rstrip("/"))
            token = r.get("NextContinuationToken")
            if len(objects) + len(prefixes) >= limit:
                return objects, prefixes, True
            if not r.get("IsTruncated") or not token:
                return objects, prefixes, False
            idle = 0 if len(objects) + len(prefixes) > known else idle + 1
            if idle >= LIST_IDLE_PAGES:
                raise TransientFailure(f"{idle} pages of the listing brought no new name")

    def close(self):
        self._client.close()


def s3_backend(url, options):
    """An S3 client for ``url``'s bucket (``for_key`` reaches its other objects)."""
    return _S3(url, options)


def source_stat(mtime):
    """What a mount shows as a remote source's owner, modes and times."""
    mtime_ns = int(mtime * 1e9)
    return SimpleNamespace(st_mode=0o100444, st_uid=os.getuid(), st_gid=os.getgid(),
                           st_atime_ns=mtime_ns, st_mtime_ns=mtime_ns, st_ctime_ns=mtime_ns)


def _connect(url, options):
    return _S3(url, options) if url.startswith("s3://") else HTTPObject(url, options)


_STORES = weakref.WeakSet()  # reset in a forked child (a daemonizing mount)


def _after_fork():
    for store in list(_STORES):
        store._forget_connections()


os.register_at_fork(after_in_child=_after_fork)


class RemoteStore:
    """One remote object, read-only, read in chunks through a bounded cache (see module)."""

    writable = False

    def __init__(self, url, options=None, *, etag=None, backend=None, version=None):
        self.url = self.label = url
        self.options = options or RemoteOptions()
        # a client, made at the first request (siblings may need none), or one shared
        self._backend_made = backend
        self._owns_backend = backend is None
        self._lock = threading.Lock()
        self._pinned = etag  # an ETag the object must still have (an HDF5 probe child)
        self._version = version  # what is served: a listing's, or fetched by the first HEAD
        self._cache = OrderedDict()  # (etag, chunk index) -> bytes
        self._pending = {}  # (etag, chunk index) -> Future of a GET in flight
        self._pool = self._ahead_pool = None
        self._failed = OrderedDict()  # (etag, chunk index) -> (monotonic time, RemoteError)
        # the last RemoteError a read met: an HDF5 probe child reports it as the network's
        # failure, not the file's (h5py hands it on as a damaged file's error)
        self.failure = None
        self._revalidation = self._new_revalidation()
        self._stale = False  # a GET found another version: check at once
        self._next_chunk = None  # where a sequential reader goes on
        self._streams = ReadStreams()  # how far readahead went for each reader
        self._ends = deque(maxlen=RECENT_ENDS)  # where the latest reads ended
        self._exact_gets = OrderedDict()  # (etag, chunk index) -> (scattered exact GETs
        # into it, the last one's start and end in it)
        self._siblings = []
        self._disk = DiskCache(self.options.cache_dir, self.options.cache_dir_size) \
            if self.options.cache_dir else None
        _STORES.add(self)

    def _forget_connections(self):
        """In a forked child: the pool's threads and the parent's connections are not ours."""
        self._pool = self._ahead_pool = None
        self._pending = {}
        self._lock = threading.Lock()
        self._revalidation = self._new_revalidation()
        self._backend_made = None
        self._owns_backend = True

    @property
    def stale(self):
        """Whether a read found another version on the server than the one served."""
        return self._stale

    # ------------------------------------------------------------ requests

    @property
    def _backend(self):
        with self._lock:
            if self._backend_made is None:
                self._backend_made = _connect(self.url, self.options)
            return self._backend_made

    def _attempts(self, what, request, *args, until=None):
        return retried(self.label, self.options, what, request, *args, until=until)

    def version(self):
        """The version served (HEAD at first use)."""
        version = self._version
        if version is None:
            version = self._attempts("HEAD", self._backend.head,
                                     until=request_deadline(self.options))
            if self._pinned and version.etag != self._pinned:
                raise RemoteError(f"{self.label}: replaced on the server while being opened")
            with self._lock:
                self._version = self._version or version
                version = self._version
        return version

    def _fetch(self, version, index, until):
        """Chunk ``index`` of ``version``, into the cache; ``until``: when the request that
        asked for it must be answered (None: readahead, no request waits)."""
        start = index * self.options.chunk_size
        end = min(start + self.options.chunk_size, version.size)
        key = (version.etag, index)
        chunk = (self.url, version.etag, self.options.chunk_size, index)
        try:
            data = self._disk.get(*chunk, end - start) if self._disk else None
            if data is None:
                data = self._attempts(f"GET bytes {start}-{end - 1}", self._get, start, end,
                                      version, until=until)
                if self._disk:
                    self._disk.put(*chunk, data)
            with self._lock:
                self._failed.pop(key, None)
                if self._version is version:
                    self._cache[key] = data
                    self._evict(version)
            return data
        except RemoteError as exc:
            self._remember_failure(version, index, index, exc)
            raise
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _evict(self, version):
        """Drop the chunks used longest ago beyond ``cache_size`` (called with the lock).
        Chunk 0 stays: it holds the container's header, which every listing checks (the
        counter), and a listing must never wait for a GET."""
        header = (version.etag, 0)
        while len(self._cache) * self.options.chunk_size > self.options.cache_size \
                and len(self._cache) > 2 - (header not in self._cache):
            oldest = next(iter(self._cache))
            if oldest == header:
                self._cache.move_to_end(oldest)
            else:
                del self._cache[oldest]

    def _get(self, start, end, version):
        try:
            data = self._backend.get(start, end, version)
        except ObjectReplaced:
            self._stale = True
            raise RemoteError(f"{self.label}: replaced on the server while being read "
                              "(reloaded at the next access)",
                              "replaced on the server while being read") from None
        return data

    def _chunk(self, version, index, until):
        """Chunk ``index`` of ``version`` if cached, else the Future of its GET (in flight,
        or asked for now: readahead if ``until`` is None). A readahead GET still waiting for
        a thread is asked for again among a reader's own. Called with the lock."""
        key = (version.etag, index)
        data = self._cache.get(key)
        if data is not None:
            self._cache.move_to_end(key)
            return data
        future = self._pending.get(key)
        if future is not None and until is not None and getattr(future, "ahead", False) \
                and future.cancel():
            future = None
        if future is None:
            future = self._pending[key] = self._executor(ahead=until is None).submit(
                self._fetch, version, index, until)
            future.ahead = until is None
        return future

    def _remember_failure(self, version, first, last, failure):
        """Chunks ``first..last`` failed: asked for again within FAILED_SECONDS, they fail
        at once with the same error (unless the server was not even asked)."""
        self.failure = failure
        if isinstance(failure, OutOfTime):
            return
        now = time.monotonic()
        with self._lock:
            for index in range(first, last + 1):
                self._failed[(version.etag, index)] = (now, failure)
                self._failed.move_to_end((version.etag, index))
            while len(self._failed) > FAILED_KEPT:
                self._failed.popitem(last=False)

    def _recent_failure(self, version, index):
        """The error chunk ``index`` failed with within FAILED_SECONDS, else None (called
        with the lock)."""
        failed = self._failed.get((version.etag, index))
        return failed[1] if failed and time.monotonic() - failed[0] < FAILED_SECONDS \
            else None

    def _wants_whole(self, version, index, lo, hi, carries_on):
        """Whether bytes ``lo..hi`` of chunk ``index`` come from the whole chunk, else from
        a GET of exactly those bytes: a reader that jumps to a chunk neither fetched nor
        being fetched reads only its own bytes (a row range of a column), one that goes on
        where a read ended gets whole chunks and readahead (a stream). Chunk 0 (the
        header), a chunk read whole, chunks kept in a cache_dir, and a chunk that got
        WHOLE_AFTER scattered exact GETs already (a read NEAR the last one and apart from
        it is not scattered) are fetched whole. Called with the lock."""
        key = (version.etag, index)
        if carries_on or index == 0 or self._disk or key in self._cache \
                or key in self._pending or hi - lo == self._chunk_length(version, index):
            return True
        gets, last_lo, last_hi = self._exact_gets.pop(key, (0, None, None))
        near = last_lo is not None and (last_hi <= lo < last_hi + NEAR
                                        or last_lo - NEAR < hi <= last_lo)
        gets += not near
        if gets > WHOLE_AFTER:
            return True
        self._exact_gets[key] = (gets, lo, hi)
        while len(self._exact_gets) > EXACT_GETS_KEPT:
            self._exact_gets.popitem(last=False)
        return False

    def _chunk_length(self, version, index):
        step = self.options.chunk_size
        return min(step, version.size - index * step)

    def _fetch_exact(self, version, start, end, until):
        """Bytes ``start..end`` alone (checked as a chunk's GET is), kept nowhere."""
        try:
            return self._attempts(f"GET bytes {start}-{end - 1}", self._get, start, end,
                                  version, until=until)
        except RemoteError as exc:
            step = self.options.chunk_size
            self._remember_failure(version, start // step, (end - 1) // step, exc)
            raise

    def _executor(self, ahead=False):
        """The pool of request threads, or with ``ahead`` the one of readahead GETs: a
        reader never queues behind GETs it did not ask for (each made at its first
        request; called with the lock)."""
        if ahead:
            if self._ahead_pool is None:
                self._ahead_pool = ThreadPoolExecutor(
                    max(1, min(self.options.readahead, self.options.concurrency)),
                    thread_name_prefix="ctdsfs-ahead")
            return self._ahead_pool
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.options.concurrency,
                                            thread_name_prefix="ctdsfs-get")
        return self._pool

    # ------------------------------------------------------------ the store interface

    def cached(self, offset, size):
        """Whether every chunk these bytes lie in is in the memory cache (kept there as
        just used, so the read that follows finds it)."""
        version = self._version
        if version is None:
            return False
        end = min(offset + size, version.size)
        step = self.options.chunk_size
        with self._lock:
            for i in range(offset // step, (end - 1) // step + 1) if offset < end else ():
                if (version.etag, i) not in self._cache:
                    return False
                self._cache.move_to_end((version.etag, i))
        return True

    def pread(self, offset, size):
        data = self.view(offset, size)
        return data if isinstance(data, bytes) else bytes(data)

    def view(self, offset, size):
        """``pread`` without copying a piece of one chunk: bytes or a read-only memoryview
        of the cached chunk (a mount hands it to the kernel as it is)."""
        version = self.version()
        until = request_deadline(self.options)
        end = min(offset + size, version.size)
        if offset >= end:
            return b""
        step = self.options.chunk_size
        first, last = offset // step, (end - 1) // step
        spans = [(max(offset, i * step), min(end, (i + 1) * step))
                 for i in range(first, last + 1)]
        with self._lock:
            for i in range(first, last + 1):
                failure = (version.etag, i) not in self._cache \
                    and self._recent_failure(version, i)
                if failure:
                    self.failure = failure
                    raise RemoteError(str(failure), failure.detail)
            carries_on = offset in self._ends
            self._ends.append(end)
            parts = []  # per chunk: its data or Future, or None for bytes GET exactly
            for i, (lo, hi) in zip(range(first, last + 1), spans):
                whole = self._wants_whole(version, i, lo - i * step, hi - i * step, carries_on)
                parts.append(self._chunk(version, i, until) if whole else None)
            exact = self._exact_requests(version, spans, parts, until)
            # readahead starts when a reader carries on past the header's chunk, or from it
            # into the next chunk (opening a container reads its first chunk piece by piece)
            was = self._next_chunk
            moved_on = carries_on and was is not None and (
                first > 0 or first in (was - 1, was) and last >= was)
            self._next_chunk = last + 1
            ahead = range(0)
            if moved_on:  # (each of several readers has its own readahead)
                start = self._streams.follow(first, last)
                ahead = range(last + 1 if start is None else start,
                              min(last + 1 + self.options.readahead, -(-version.size // step)))
                self._streams.asked(last, ahead.stop - 1)
            for i in ahead:
                if not self._recent_failure(version, i):
                    self._chunk(version, i, None)
        pieces = []
        for i, (lo, hi), data in zip(range(first, last + 1), spans, parts):
            if data is None:
                pieces.append(self._exact_piece(exact, lo, hi, version, until))
                continue
            data = self._result(data, version, lo, hi, until)
            lo, hi = lo - i * step, hi - i * step
            pieces.append(data if (lo, hi) == (0, len(data)) else memoryview(data)[lo:hi])
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _exact_requests(self, version, spans, parts, until):
        """``[(start, end, Future)]``: one exact GET per run of neighbouring spans whose
        chunk is not read whole (called with the lock)."""
        runs = []
        for (lo, hi), data in zip(spans, parts):
            if data is not None:
                continue
            if runs and runs[-1][1] == lo:
                runs[-1][1] = hi
            else:
                runs.append([lo, hi])
        return [(lo, hi, self._executor().submit(self._fetch_exact, version, lo, hi, until))
                for lo, hi in runs]

    def _exact_piece(self, exact, lo, hi, version, until):
        """Bytes ``lo..hi`` out of the exact GET that holds them."""
        start, _, future = next(e for e in exact if e[0] <= lo and hi <= e[1])
        data = self._result(future, version, lo, hi, until)
        return data if (lo - start, hi - start) == (0, len(data)) \
            else memoryview(data)[lo - start:hi - start]

    def _result(self, data, version, lo, hi, until):
        """What a GET of bytes ``lo..hi`` brought (waited for until ``until``, when the
        request must be answered), or ``data`` itself if it is no Future."""
        if not isinstance(data, Future):
            return data
        try:
            return data.result(max(0.0, until - time.monotonic()) + WAIT_GRACE)
        except CancelledError:  # closed meanwhile: its object was replaced or removed
            raise RemoteError(f"{self.label}: replaced on the server while being read",
                              "replaced on the server while being read") from None
        except TimeoutError:  # (a GET begun before this request: it goes on, unwaited)
            detail = f"GET bytes {lo}-{hi - 1}: no answer within the request's time"
            failure = RemoteError(f"{self.label}: {detail}", detail)
            step = self.options.chunk_size
            self._remember_failure(version, lo // step, (hi - 1) // step, failure)
            raise failure from None

    def size(self):
        return self.version().size

    def stat(self):
        """What a mount shows as the source's owner, modes and times."""
        return source_stat(self.version().mtime)

    def _new_revalidation(self):
        return Revalidation(self.label, self.options.revalidate, self._check_version,
                            "check for a new version", start=self._in_pool)

    def _in_pool(self, function):
        with self._lock:
            self._executor().submit(function)

    def replaced(self):
        """Whether a check found the object replaced (a new ETag) since last asked; the
        store then serves the new version. Never waits for the network: checks run in the
        background (``Revalidation``), at once after a read found another version."""
        found = self._revalidation.take(urgent=self._stale)
        if found is None:
            return False
        new, header = found
        with self._lock:
            old, self._version = self._version, new
            self._cache.clear()
            self._cache[(new.etag, 0)] = header
            self._failed.clear()
            self._next_chunk = None
            self._streams = ReadStreams()
            self._exact_gets.clear()
            for sibling in self._siblings:
                sibling._version = None
        log.info("%s: replaced on the server (ETag %s -> %s): reloaded", self.label,
                 old and old.etag, new.etag)
        return True

    def _check_version(self):
        """One HEAD: ``(version, its first chunk)`` of a version other than the one served,
        else None. The new version is served only once its first chunk (the container's
        header) came in whole: a server naming a version it cannot give keeps the one
        known served (stale if error), and a reload never waits for a GET."""
        new = self._backend.head()
        with self._lock:
            self._stale = False
            old = self._version
        if old is None or (new.etag, new.size) == (old.etag, old.size):
            return None
        try:
            return new, self._backend.get(0, self._chunk_length(new, 0), new) \
                if new.size else b""
        except ObjectReplaced:
            raise TransientFailure(f"the version it names ({new.etag}) is not the one it "
                                   "serves") from None

    def sibling(self, suffix):
        """The object named like this one plus ``suffix`` (a v1 MultiFile's ``_hdrext``),
        asked for only when read, and re-read whenever this one is replaced."""
        shared = self._backend_made
        other = RemoteStore(self.url + suffix, self.options,
                            backend=shared.for_key(shared.key + suffix)
                            if hasattr(shared, "for_key") else None)
        self._siblings.append(other)
        return other

    def fileobj(self):
        """A read-only file object over the object (for h5py's file-object driver)."""
        return RemoteFile(self)

    def child_spec(self):
        """What an HDF5 probe child needs to read the same version (``from_spec``)."""
        return json.dumps({"url": self.url, "etag": self.version().etag,
                           "options": dataclasses.asdict(self.options)})

    def time_left(self):
        """Seconds the current user's request may still wait for this object."""
        return request_deadline(self.options) - time.monotonic()

    def close(self):
        for pool in (self._pool, self._ahead_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if self._backend_made is not None and self._owns_backend:
            self._backend_made.close()
        self._cache.clear()


class RemoteFile(io.RawIOBase):
    """A seekable, read-only file object reading through a RemoteStore."""

    def __init__(self, store):
        super().__init__()
        self.store = store
        self.position = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.store.size()}
        self.position = max(0, base[whence] + offset)
        return self.position

    def tell(self):
        return self.position

    def readinto(self, buffer):
        data = self.store.view(self.position, len(buffer))
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def from_spec(text):
    """The store ``child_spec()`` describes, pinned to the same ETag."""
    spec = json.loads(text)
    return RemoteStore(spec["url"], RemoteOptions(**spec["options"]), etag=spec["etag"])


def open_remote(url, options=None):
    """The object at ``url``, its size and version read now (one line if that fails)."""
    if not is_remote(url):
        raise CtdsfsError(f"{url}: not an s3://, http:// or https:// address")
    store = RemoteStore(url, options)
    try:
        store.version()
    except BaseException:
        store.close()
        raise
    return store

