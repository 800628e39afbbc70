"""moto's S3 server, serving a byte range by reading only that range.

moto 5.2.5 answers a range GET by reading the whole object and slicing it, so each range
read of a 50 MB data file costs as much as reading the file: the emulator, not the
protocol, then dominates a Lance scan. S3 serves a range at the cost of the range. This
launcher changes only that: a GET with one `bytes=FIRST-LAST` range reads the range from
the object's buffer; every other request is moto's own code path.
"""
import re
import sys
import threading

from moto.s3 import models, responses
from moto.server import main

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

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
