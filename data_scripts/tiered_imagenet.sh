#!/usr/bin/env bash
# tiered-ImageNet (Ren et al., 2018; 351/97/160 classes) in the class-folder layout of E3BM,
# which SSR uses. Lays out <dest>/tiered_imagenet/{train,val,test}/.
# Usage: data_scripts/tiered_imagenet.sh <dest>
# The images are ImageNet images: by downloading them you accept the ImageNet terms of access.
source "$(dirname "$0")/common.sh"
usage_root "$@"
need tar unzip
# The Google Drive file linked from SSR's transductive_few_shot/README.md (provided by E3BM).
fetch "https://drive.usercontent.google.com/download?id=1T-4NVTSa5T6CXKSRbymYLnWp_OrtF-mo&export=download&confirm=t" tiered_imagenet.archive
no_checksum tiered_imagenet.archive
if [[ ! -d tiered_imagenet/train ]]; then
    if unzip -tq tiered_imagenet.archive >/dev/null 2>&1; then
        unzip -q -n tiered_imagenet.archive
    else
        tar -xf tiered_imagenet.archive
    fi
fi
for p in train val test; do require_file "tiered_imagenet/$p"; done
echo ">> ready: rankwise::data::loaders::fewshot_sets::load_folders(\"$PWD/tiered_imagenet\")"
