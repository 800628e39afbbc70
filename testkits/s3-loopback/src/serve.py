"""moto's S3 server, serving a byte range by reading only that range, with conditional
writes that are atomic.

moto 5.2.5 answers a range GET by reading the whole object and slicing it, so each range
read of a 50 MB data file costs as much as reading the file: the emulator, not the
protocol, then dominates a Lance scan. S3 serves a range at the cost of the range. Here a
GET with one `bytes=FIRST-LAST` range reads the range from the object's buffer.

moto checks `If-None-Match: *` and `If-Match` and then writes, with nothing held between,
on a threaded server: two racing put-if-absents of one key can both answer 200, and so can
two `If-Match` puts naming the same ETag (measured: several winners in most rounds of 16
racing 6 MB writers). S3 lets exactly one win, and ctxlog's creation, claims and takeovers
and Lance's commits rest on that. Here every write of a key (PUT, copy, POST such as
CompleteMultipartUpload, DELETE) runs its check and its write under one lock per key; and
an object's ETag, which moto computes lazily from the buffer, is computed under the
object's own lock, so that a concurrent reader cannot rewind the buffer under it. (The
lock also ends the 500s of racing writers: moto closes a replaced object's buffer at once,
under a writer still reading it. A GET racing an overwrite can still meet one; clients
retry it.) Everything else is moto's own code path.

With `CTXLOG_S3_LATENCY_MS` set, every request waits that long before it is handled (what a
round trip to a real object store costs), and `GET /_ctxlog/requests` answers how many
requests the server has had — neither delayed nor counted — for measuring what a client
costs while idle.
"""
import os
import re
import sys
import threading
import time

from moto.moto_server import werkzeug_app
from moto.s3 import models, responses
from moto.server import main

_LATENCY = float(os.environ.get("CTXLOG_S3_LATENCY_MS", "0")) / 1000.0
_requests = 0
_requests_lock = threading.Lock()
_dispatch = werkzeug_app.DomainDispatcherApplication.__call__


def _counted(self, environ, start_response):
    global _requests
    if environ.get("PATH_INFO") == "/_ctxlog/requests":
        with _requests_lock:
            body = str(_requests).encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    with _requests_lock:
        _requests += 1
    if _LATENCY:
        time.sleep(_LATENCY)
    return _dispatch(self, environ, start_response)


werkzeug_app.DomainDispatcherApplication.__call__ = _counted

_local = threading.local()
_value = models.FakeKey.value
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _Ranged:
    """An object's bytes, read one slice at a time (what moto's range handler takes)."""

    def __init__(self, key):
        self._key = key

    def __len__(self):
        return self._key.size

    def __getitem__(self, which):
        first, stop, _ = which.indices(self._key.size)
        with self._key.lock:
            self._key._value_buffer.seek(first)
            return self._key._value_buffer.read(max(0, stop - first))


def _value_get(key):
    return _Ranged(key) if getattr(_local, "ranged", False) else _value.fget(key)


models.FakeKey.value = property(_value_get, _value.fset)
_get_object = responses.S3Response.get_object


def _ranged_get_object(self):
    if not _RANGE.fullmatch(self.headers.get("range") or "") or self._get_int_param("partNumber"):
        return _get_object(self)
    _local.ranged = True
    try:
        return _get_object(self)
    finally:
        _local.ranged = False


responses.S3Response.get_object = _ranged_get_object

# One lock per key, striped: a key always maps to the same lock; two keys share one rarely,
# which only serialises them. Each request takes one lock, after moto has read its body, so
# the lock covers moto's check and its write of a body already in hand.
_KEY_LOCKS = [threading.RLock() for _ in range(1024)]


def _locked(handler, skip=lambda self: False):
    def locked(self, *args, **kwargs):
        if skip(self):
            return handler(self, *args, **kwargs)
        # The bucket and key moto's handlers themselves write.
        which = hash((self.bucket_name, self.parse_key_name())) % len(_KEY_LOCKS)
        with _KEY_LOCKS[which]:
            return handler(self, *args, **kwargs)

    return locked


def _is_part_upload(self):
    # A part upload writes a part of the upload, not the key: no lock, so that the parts of
    # one upload still arrive in parallel.
    return "uploadId" in self.querystring and "partNumber" in self.querystring


S3 = responses.S3Response
S3._key_response_put = _locked(S3._key_response_put, skip=_is_part_upload)
S3._key_response_post = _locked(S3._key_response_post)
S3._key_response_delete = _locked(S3._key_response_delete)

_etag = models.FakeKey.etag


def _etag_get(key):
    with key.lock:
        return _etag.fget(key)


models.FakeKey.etag = property(_etag_get, _etag.fset)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
