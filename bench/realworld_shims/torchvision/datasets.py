import torch


class FakeData(torch.utils.data.Dataset):
    """Random images of `image_size`, the same for the same index (as torchvision's)."""

    def __init__(
        self,
        size=1000,
        image_size=(3, 224, 224),
        num_classes=10,
        transform=None,
        target_transform=None,
        random_offset=0,
    ):
        self.size, self.image_size, self.num_classes = size, image_size, num_classes
        self.transform, self.random_offset = transform, random_offset

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index + self.random_offset)
        image = torch.rand(*self.image_size, generator=generator)
        target = int(torch.randint(0, self.num_classes, (1,), generator=generator))
        return (self.transform(image) if self.transform else image), target
