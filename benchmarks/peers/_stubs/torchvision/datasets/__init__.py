"""Stub: only the names that ``streaming.vision`` imports."""

from .. import _unavailable


class VisionDataset:
    def __init__(self, *args, **kwargs):
        _unavailable()


class CIFAR10(VisionDataset):
    pass
