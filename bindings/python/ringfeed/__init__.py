"""ringfeed: a data loader that keeps GPUs fed, through ctypes (no compiled extension).

    import ringfeed
    loader = ringfeed.Loader("shards/train-{000000..000146}.tar", batch_size=256, workers=8,
                             image_size=224, crop="random_resized", flip=True, device="cuda")
    for batch in loader:   # {"image": [B,H,W,3] uint8, "label": [B] int64, "key": [...]}
        ...
"""

from ._loader import Error, Loader, Writer, version

__all__ = ["Error", "Loader", "Writer", "version"]
__version__ = "0.1.0"
