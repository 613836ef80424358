#!/usr/bin/env bash
# iNaturalist 2018 with the Smooth-AP retrieval split (used by HAPPIER as iNat-base / iNat-full).
# Lays out <dest>/{train_val2018/,train2018.json,categories.json,Inat_dataset_splits/}.
# The images are 120 GB (the organisers' figure). Usage: data_scripts/inaturalist.sh <dest>
source "$(dirname "$0")/common.sh"
usage_root "$@"
need tar unzip
base=https://ml-inat-competition-datasets.s3.amazonaws.com/2018
# md5 checksums as published in github.com/visipedia/inat_comp/tree/master/2018.
fetch "$base/train_val2018.tar.gz" train_val2018.tar.gz
verify_md5 train_val2018.tar.gz b1c6952ce38f31868cc50ea72d066cc3
fetch "$base/train2018.json.tar.gz" train2018.json.tar.gz
verify_md5 train2018.json.tar.gz bfa29d89d629cbf04d826a720c0a68b0
# Un-obfuscated names (optional for the loader, which reads train2018.json first).
fetch "$base/categories.json.tar.gz" categories.json.tar.gz
no_checksum categories.json.tar.gz
# The Smooth-AP split (Google Drive file of github.com/Andrew-Brown1/Smooth_AP).
fetch "https://drive.usercontent.google.com/download?id=1sXfkBTFDrRU3__-NUs1qBP3sf_0uMB98&export=download&confirm=t" Inat_dataset_splits.zip
no_checksum Inat_dataset_splits.zip
[[ -d train_val2018 ]] || tar -xzf train_val2018.tar.gz
[[ -f train2018.json ]] || tar -xzf train2018.json.tar.gz
[[ -f categories.json ]] || tar -xzf categories.json.tar.gz
[[ -d Inat_dataset_splits ]] || unzip -q Inat_dataset_splits.zip
require_file train2018.json
require_file Inat_dataset_splits/Inaturalist_train_set1.txt
require_file Inat_dataset_splits/Inaturalist_test_set1.txt
echo ">> ready: rankwise::data::loaders::inaturalist::load(\"$PWD\", &InatConfig::base())"
