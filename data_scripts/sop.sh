#!/usr/bin/env bash
# Stanford Online Products (Oh Song et al., CVPR 2016): 120,053 images, 22,634 products,
# 12 super-classes. Lays out <dest>/Stanford_Online_Products/{Ebay_train.txt,Ebay_test.txt,...}.
# Usage: data_scripts/sop.sh <dest> [archive URL]
# The URL defaults to the authors' FTP server; pass a mirror as second argument if it is down.
source "$(dirname "$0")/common.sh"
usage_root "$@"
need unzip
url=${2:-ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip}
fetch "$url" Stanford_Online_Products.zip
no_checksum Stanford_Online_Products.zip
[[ -d Stanford_Online_Products ]] || unzip -q Stanford_Online_Products.zip
require_file Stanford_Online_Products/Ebay_train.txt
require_file Stanford_Online_Products/Ebay_test.txt
echo ">> ready: rankwise::data::loaders::sop::load(\"$PWD/Stanford_Online_Products\")"
