"""Stand-in for torchvision (see ../README.md): datasets.FakeData, transforms, utils.save_image."""

from . import datasets, transforms, utils  # noqa: F401
