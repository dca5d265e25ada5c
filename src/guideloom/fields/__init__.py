"""Records of named, typed fields, media among them: ``RecordSchema`` and its field types (docs/multimodal.md).

``DocumentStorage(path, RecordSchema(caption=Text(), image=Image()))`` writes dicts of those fields and reads them
back, media fields as values with their metadata (``ImageValue``, ``AudioValue``, ``VideoValue``) decoded on
request. Decoding needs the ``media`` extra: ``pip install 'guideloom[media]'`` (Pillow, soundfile, PyAV).
"""

from guideloom._core.errors import MediaDecodeError
from guideloom._fields.field_types import Array, Audio, FieldType, Image, Images, Json, Scalar, Text, Tokens, Video
from guideloom._fields.media import AudioValue, ImageValue, MediaValue, VideoValue
from guideloom._fields.schema import RecordSchema

__all__ = [
    "Array",
    "Audio",
    "AudioValue",
    "FieldType",
    "Image",
    "ImageValue",
    "Images",
    "Json",
    "MediaDecodeError",
    "MediaValue",
    "RecordSchema",
    "Scalar",
    "Text",
    "Tokens",
    "Video",
    "VideoValue",
]
