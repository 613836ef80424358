#!/usr/bin/env bash
# Fashion-MNIST (Xiao et al., 2017): 70,000 grey 28 x 28 images in 10 classes, MIT licence.
# On Debian / Ubuntu the simplest is the package (no download script needed):
#   sudo apt-get install dataset-fashion-mnist   # files in /usr/share/datasets/fashion-mnist
# Otherwise this script downloads the four IDX files from the authors' repository into <dest>.
# Usage: data_scripts/fashion_mnist.sh <dest>
source "$(dirname "$0")/common.sh"
usage_root "$@"
base=https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion
# md5 checksums as published in the authors' README.
while read -r name md5; do
    fetch "$base/$name" "$name"
    verify_md5 "$name" "$md5"
done <<'LIST'
train-images-idx3-ubyte.gz 8d4fb7e6c68d591d4c3dfef9ec88bf0d
train-labels-idx1-ubyte.gz 25c81989df183df01b3e8a0aad5dffbe
t10k-images-idx3-ubyte.gz bef4ecab320f06d8554ea6380940ec79
t10k-labels-idx1-ubyte.gz bb300cfdad3c16e7a12a480ee83cd310
LIST
echo ">> ready: rankwise::data::loaders::fashion_mnist::load(\"$PWD\")"
