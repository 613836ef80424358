#!/usr/bin/env python3
"""CIFAR-FS (Bertinetto et al., ICLR 2019): the 100 CIFAR-100 classes split 64 / 16 / 20 into
base / validation / novel classes, 600 images (train + test) per class, 32 x 32.

Python standard library only. Downloads the CIFAR-100 binary archive, checks the md5 the CIFAR
page publishes, and writes the images as PNG files in the class-folder layout of SSR:
    <dest>/cifar-fs/{train,val,test}/<class>/{train,test}_<index>.png
Usage:
    python3 data_scripts/cifar_fs.py <dest> [--splits DIR]
--splits DIR reads the class lists from DIR/{train,val,test}.txt (e.g. the cifar-fs-splits folder
of SSR / SIB) instead of the built-in lists, which are Bertinetto et al.'s split as distributed
with torchmeta.

Differences from SSR's get_cifarfs.py, which re-encodes the images as JPEG (Pillow's default
quality 75) under their CIFAR file names: here the pixels are stored losslessly, and the file
names are the image's index in the CIFAR-100 binary files (which carry no names). SSR's fixed
validation episodes (val1000Episode_*.json) name get_cifarfs.py's files, so use SSR's own folder
to reproduce those episodes exactly.
"""
import hashlib
import os
import struct
import sys
import tarfile
import urllib.request
import zlib

URL = "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz"
MD5 = "03b5dce01913d631647c71ecec9e9cb8"  # published on https://www.cs.toronto.edu/~kriz/cifar.html

SPLITS = {
    "train": """dolphin seal aquarium_fish ray trout orchid sunflower tulip bottle bowl can cup
        plate apple mushroom orange pear clock keyboard chair couch bee caterpillar cockroach
        bear lion tiger wolf bridge castle house road skyscraper cloud forest mountain elephant
        kangaroo porcupine possum raccoon skunk lobster spider boy girl dinosaur lizard snake
        turtle hamster mouse rabbit shrew squirrel oak_tree palm_tree pine_tree willow_tree bus
        train lawn_mower streetcar tank""",
    "val": """beaver otter flatfish shark lamp television beetle butterfly sea camel cattle crab
        crocodile maple_tree motorcycle tractor""",
    "test": """whale poppy rose sweet_pepper telephone bed table wardrobe leopard plain
        chimpanzee fox snail worm baby man woman bicycle pickup_truck rocket""",
}
COUNTS = {"train": 64, "val": 16, "test": 20}


def die(msg):
    sys.exit("error: " + msg)


def download(dest):
    path = os.path.join(dest, "cifar-100-binary.tar.gz")
    if not os.path.isfile(path):
        print(">> downloading " + URL)
        urllib.request.urlretrieve(URL, path + ".partial")
        os.replace(path + ".partial", path)
    md5 = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            md5.update(chunk)
    if md5.hexdigest() != MD5:
        die("%s: md5 %s, the CIFAR page publishes %s" % (path, md5.hexdigest(), MD5))
    print(">> %s: md5 matches the published checksum" % path)
    return path


def png(width, height, rgb_rows):
    """A minimal RGB PNG (8 bits per channel, no filtering)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + row for row in rgb_rows)
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def read_splits(splits_dir):
    if splits_dir is None:
        return {k: v.split() for k, v in SPLITS.items()}
    out = {}
    for part in ("train", "val", "test"):
        with open(os.path.join(splits_dir, part + ".txt")) as f:
            out[part] = [line.strip() for line in f if line.strip()]
    return out


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--splits"):
        die("usage: %s <dest> [--splits DIR]" % argv[0])
    dest = os.path.abspath(argv[1])
    os.makedirs(dest, exist_ok=True)
    splits = read_splits(argv[3] if len(argv) == 4 else None)
    archive = download(dest)
    with tarfile.open(archive) as tar:
        names = tar.extractfile("cifar-100-binary/fine_label_names.txt").read().decode().split()
        part_of = {}
        for part, classes in splits.items():
            if len(classes) != COUNTS[part]:
                die("%s split has %d classes, expected %d" % (part, len(classes), COUNTS[part]))
            for c in classes:
                if c not in names:
                    die("class '%s' of the %s split is not a CIFAR-100 class" % (c, part))
                if c in part_of:
                    die("class '%s' is in two splits" % c)
                part_of[c] = part
        written = 0
        for source in ("train", "test"):
            data = tar.extractfile("cifar-100-binary/%s.bin" % source).read()
            record = 2 + 3072  # coarse label, fine label, 1024 R + 1024 G + 1024 B bytes
            if len(data) % record:
                die("%s.bin has a partial record" % source)
            for index in range(len(data) // record):
                r = data[index * record:(index + 1) * record]
                cls = names[r[1]]
                planes = r[2:]
                rows = [bytes(v for x in range(32) for v in
                              (planes[y * 32 + x], planes[1024 + y * 32 + x],
                               planes[2048 + y * 32 + x])) for y in range(32)]
                folder = os.path.join(dest, "cifar-fs", part_of[cls], cls)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "%s_%05d.png" % (source, index)), "wb") as f:
                    f.write(png(32, 32, rows))
                written += 1
    if written != 60000:
        die("wrote %d images, expected 60000" % written)
    print(">> ready: rankwise::data::loaders::fewshot_sets::load_folders(\"%s\")"
          % os.path.join(dest, "cifar-fs"))


if __name__ == "__main__":
    main(sys.argv)
