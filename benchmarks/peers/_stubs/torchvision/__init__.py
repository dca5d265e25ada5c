"""Placeholder ``torchvision`` for the MosaicML Streaming adapter only.

``import streaming`` imports its vision datasets, which import torchvision at
module level. The torchvision wheel that pip resolves beside the CPU build of
torch fails to load (its compiled operators do not match), and the text/token
benchmarks never touch vision code, so the Mosaic adapter puts this directory
first on ``sys.path``. Anything that actually uses torchvision fails loudly.
"""

__version__ = "0.0.0+benchmark-stub"
STUB = True


def _unavailable(*args, **kwargs):
    raise RuntimeError("torchvision is stubbed out in the benchmark environment")
