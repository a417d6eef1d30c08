"""Datasets of the benchmark: records and transforms, the paper's datasets, the generated proxy data."""

from .generated import SyntheticImageDataset as SyntheticImageDataset
from .generated import make_synthetic_dataset as make_synthetic_dataset
from .generated import make_synthetic_train_test as make_synthetic_train_test
from .generated import synthetic_class_split as synthetic_class_split
from .loaders import load_cifar100 as load_cifar100
from .loaders import load_cub200 as load_cub200
from .loaders import load_dataset as load_dataset
from .loaders import load_imagenet_r as load_imagenet_r
from .records import AUTOAUGMENT_POLICY as AUTOAUGMENT_POLICY
from .records import DATASET_STATS as DATASET_STATS
from .records import BatchTrainTransform as BatchTrainTransform
from .records import DatasetNotFoundError as DatasetNotFoundError
from .records import FolderImageDataset as FolderImageDataset
from .records import ImageDataset as ImageDataset
from .records import TensorImageDataset as TensorImageDataset

__all__ = [
    "DATASET_STATS",
    "AUTOAUGMENT_POLICY",
    "DatasetNotFoundError",
    "ImageDataset",
    "TensorImageDataset",
    "FolderImageDataset",
    "SyntheticImageDataset",
    "BatchTrainTransform",
    "load_cifar100",
    "load_imagenet_r",
    "load_cub200",
    "load_dataset",
    "synthetic_class_split",
    "make_synthetic_dataset",
    "make_synthetic_train_test",
]
