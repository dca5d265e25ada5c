"""What the loader does with records of a `RecordSchema` when asked: read only some fields (``fields=``) and decode
media fields in its worker processes before the collate (``decode=``), leaving out records that fail to decode
with ``on_decode_error="skip"``.

The loader hands ``from_storage``'s keywords to ``record_loading``, which returns the storage to read (reading only
the fields named) and the collate to run (decoding first); nothing else of the loader changes, so which records a
batch holds, its state and its resumption are those of any document storage.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from guideloom._core.errors import MediaDecodeError
from guideloom._core.metrics import count_skipped
from guideloom._fields.field_types import Audio, Image, Images, Video
from guideloom._fields.media import AudioValue, ImageValue, MediaValue, Origin, VideoValue, where
from guideloom._fields.schema import RecordSchema
from guideloom._storage.storages import DocumentStorage

LOGGER = logging.getLogger("guideloom")
DECODE_ERRORS = ("raise", "skip")
Decoder = Callable[[Any], Any]
VALUES: dict[type, type[ImageValue | AudioValue | VideoValue]] = {
    Image: ImageValue,
    Images: ImageValue,
    Audio: AudioValue,
    Video: VideoValue,
}


def record_loading(
    storage: Any,
    collate: Callable[[Any], Any] | None,
    *,
    fields: object,
    decode: object,
    on_decode_error: object,
) -> tuple[Any, Callable[[Any], Any] | None]:
    """The storage (or mixture) the loader reads and the collate it runs, for these keywords of ``from_storage``;
    both unchanged when none is given."""
    if on_decode_error not in DECODE_ERRORS:
        raise ValueError(f"on_decode_error must be 'raise' or 'skip', got {on_decode_error!r}")
    if isinstance(decode, bool) and not decode and fields is None:
        if on_decode_error == "skip":
            raise ValueError('on_decode_error="skip" leaves out records whose media fail to decode: it needs decode=')
        return storage, collate
    schemas = _schemas(storage)
    if fields is not None:
        storage = _reading_fields(storage, fields)
    decoders = _decoders(decode, schemas, fields)
    if on_decode_error == "skip" and not decoders:
        raise ValueError('on_decode_error="skip" leaves out records whose media fail to decode: it needs decode=')
    if not decoders:
        return storage, collate
    return storage, DecodingCollate(decoders, collate, skip=on_decode_error == "skip")


def _schemas(storage: Any) -> list[RecordSchema]:
    """The schemas of ``storage`` (each component of a mixture); an error if one is not a storage of a schema."""
    components = getattr(storage, "components", None)
    members = list(components.values()) if isinstance(components, Mapping) else [storage]
    for member in members:
        if not (isinstance(member, DocumentStorage) and isinstance(member.format, RecordSchema)):
            raise ValueError(
                "fields= and decode= read records of a guideloom.fields.RecordSchema: "
                f"{member!r} is not a DocumentStorage with one"
            )
    return [member.format for member in members]


def _reading_fields(storage: Any, fields: object) -> Any:
    """A copy of ``storage`` (of each component of a mixture) whose reader reads only ``fields``."""
    if isinstance(storage, DocumentStorage):
        schema = storage.format
        assert isinstance(schema, RecordSchema)  # (checked by ``_schemas``)
        chosen = copy.copy(storage)
        chosen.format = schema.selecting(schema.check_fields(fields))
        return chosen
    mixture = copy.copy(storage)
    mixture.components = {name: _reading_fields(member, fields) for name, member in storage.components.items()}
    return mixture


def _decoders(decode: object, schemas: list[RecordSchema], fields: object) -> dict[str, Decoder | None]:
    """Field name -> what decodes it (None: the value's own ``decode()``), for the fields read."""
    read = set(schemas[0].check_fields(fields)) if fields is not None else None
    if isinstance(decode, bool):
        if not decode:
            return {}
        media = {name for schema in schemas for name in schema.media_fields}
        return {name: None for name in sorted(media) if read is None or name in read}
    if not isinstance(decode, Mapping):
        raise TypeError(f"decode must be True, False or a dict of field name -> function, got {type(decode).__name__}")
    chosen: dict[str, Decoder | None] = {}
    for name, function in decode.items():
        if not any(name in schema.fields for schema in schemas):
            raise ValueError(f"decode names field {name!r}, which the storage's schema does not have")
        if read is not None and name not in read:
            raise ValueError(f"decode names field {name!r}, which fields= does not read")
        if function is True:
            chosen[name] = None
        elif isinstance(function, Mapping):
            chosen[name] = DecodeOptions(name, dict(function), schemas)
        elif callable(function):
            chosen[name] = function
        else:
            raise TypeError(
                f"decode[{name!r}] must be a function of the field's value, True, or a dict of the keyword "
                f"arguments of the value's decode(), got {function!r}"
            )
    return chosen


class DecodeOptions:
    """``decode={"image": {"size": 224}}``: the value's own ``decode(**options)`` (each image's, for an ``Images``
    field); the options are checked against that ``decode`` where ``from_storage`` is called, not in a worker."""

    def __init__(self, name: str, options: dict[str, Any], schemas: list[RecordSchema]) -> None:
        kinds = {type(schema.fields[name]) for schema in schemas if name in schema.fields}
        if not kinds <= set(VALUES):
            raise ValueError(f"decode[{name!r}] gives decode() options, but field {name!r} is not a media field")
        for value in {VALUES[kind] for kind in kinds}:
            try:
                inspect.signature(value.decode).bind_partial(None, **options)
            except TypeError as error:
                raise TypeError(f"decode[{name!r}]: {value.__name__}.decode() {error}") from None
        self.options = options

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            return [item.decode(**self.options) for item in value]
        return value.decode(**self.options)


class DecodingCollate:
    """Runs in the loader's workers: each record's media fields decoded (by their ``decode()`` or the function
    given), then the user's collate (or the source's own, which keeps the list). A record that fails to decode is a
    ``MediaDecodeError`` naming shard, record and field, or, with ``skip``, left out of its batch (or its row)."""

    def __init__(self, decoders: dict[str, Decoder | None], collate: Callable[[Any], Any] | None, skip: bool) -> None:
        self.decoders = decoders
        self.collate = collate
        self.skip = skip
        self.skipped = 0  # records left out by this process (a worker's own count)

    def __call__(self, samples: list[Any]) -> Any:
        decoded = []
        for sample in samples:
            if isinstance(sample, list):  # a packed row of records
                decoded.append([record for record in sample if self._decoded(record)])
            elif self._decoded(sample):
                decoded.append(sample)
        return decoded if self.collate is None else self.collate(decoded)

    def _decoded(self, record: dict[str, Any]) -> bool:
        """Decode ``record``'s fields in place; False if it is to be left out (``skip``)."""
        for name, function in self.decoders.items():
            value = record.get(name)
            if value is None:
                continue
            try:
                if function is not None:
                    record[name] = function(value)
                elif isinstance(value, list):
                    record[name] = [item.decode() for item in value]
                else:
                    record[name] = value.decode()
            except MediaDecodeError as error:
                if self.skip:
                    return self._skipped(error)
                raise
            except Exception as error:  # a decode function's own error: named as the decoder's would be
                origin = _origin(record, value, name)
                named = MediaDecodeError(f"cannot decode {where(origin)}: {type(error).__name__}: {error}")
                if self.skip:
                    return self._skipped(named)
                raise named from error
        return True

    def _skipped(self, error: MediaDecodeError) -> bool:
        """Count and log a record left out (the log says which, and why; ``loader.metrics()`` counts it); False."""
        self.skipped += 1
        count_skipped()
        LOGGER.warning("on_decode_error='skip': left out a record: %s", error)
        return False


def _origin(record: dict[str, Any], value: Any, name: str) -> Origin:
    """Where ``record`` was read from, from its media values (a record of small fields alone does not say)."""
    candidates = [value, *record.values()]
    for candidate in candidates:
        first = candidate[0] if isinstance(candidate, list) and candidate else candidate
        if isinstance(first, MediaValue):
            shard, number, _ = first.origin
            return shard, number, name
    return None, None, name
