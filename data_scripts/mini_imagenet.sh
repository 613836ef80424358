#!/usr/bin/env bash
# mini-ImageNet (Vinyals et al., 2016; Ravi & Larochelle's 64/16/20 split) as SSR and SIB
# distribute it: 84 x 84 images in class folders. Lays out <dest>/Mini-ImageNet/{train,val,test}/.
# Usage: data_scripts/mini_imagenet.sh <dest>
# The images are ImageNet images: by downloading them you accept the ImageNet terms of access.
source "$(dirname "$0")/common.sh"
usage_root "$@"
need unzip
# The Dropbox link of SSR's transductive_few_shot/data/download_miniimagenet.sh.
fetch "https://www.dropbox.com/s/a2a0bll17f5dvhr/Mini-ImageNet.zip?dl=1" Mini-ImageNet.zip
no_checksum Mini-ImageNet.zip
if [[ ! -d Mini-ImageNet/train ]]; then
    unzip -q -n Mini-ImageNet.zip
    # As SSR's script: keep train_train as the base split, drop the other two train variants.
    rm -rf Mini-ImageNet/train_val Mini-ImageNet/train_test
    mv Mini-ImageNet/train_train Mini-ImageNet/train
fi
for p in train val test; do require_file "Mini-ImageNet/$p"; done
echo ">> ready: rankwise::data::loaders::fewshot_sets::load_folders(\"$PWD/Mini-ImageNet\")"
