#!/usr/bin/env bash
# In-Shop Clothes Retrieval (DeepFashion, Liu et al., CVPR 2016): 52,712 images of 7,982 items.
# The benchmark is distributed from a Google Drive folder after accepting the DeepFashion
# agreement, so it cannot be fetched by a script: download `Img/img.zip` and
# `Eval/list_eval_partition.txt` from the "In-shop Clothes Retrieval Benchmark" folder
# (http://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html), then run
#   data_scripts/inshop.sh <dest> <path to img.zip> <path to list_eval_partition.txt>
# to lay out <dest>/inshop/{Eval/list_eval_partition.txt,Img/img/...}.
source "$(dirname "$0")/common.sh"
[[ $# -eq 3 ]] || die "usage: $0 <dest> <img.zip> <list_eval_partition.txt>"
zip=$(realpath "$2")
list=$(realpath "$3")
usage_root "$1"
need unzip
no_checksum "$zip"
no_checksum "$list"
mkdir -p inshop/Eval inshop/Img
cp "$list" inshop/Eval/list_eval_partition.txt
[[ -d inshop/Img/img ]] || unzip -q "$zip" -d inshop/Img
require_file inshop/Img/img
echo ">> ready: rankwise::data::loaders::inshop::load(\"$PWD/inshop\")"
