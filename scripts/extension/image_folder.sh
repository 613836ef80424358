#!/usr/bin/env bash
# The example data script of scripts/extension_check.sh (issue #23): arranges a folder of class
# folders (`<src>/<class>/<image>`, torchvision's ImageFolder layout) as the `image_folder`
# dataset, split by class as the metric-learning papers split CUB and Cars196: the first half of
# the classes (sorted by name) for training, the rest for test. Images are linked, not copied.
#
#   data_scripts/image_folder.sh <src> <dst>
#
# Then train with `[dataset] kind = "imagefolder"` and `root = "<dst>"` (configs/image_folder.toml).
set -euo pipefail
if (($# != 2)); then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
dst=$2
mapfile -t classes < <(find "$src" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | LC_ALL=C sort)
if ((${#classes[@]} < 2)); then
  echo "image_folder.sh: $src holds ${#classes[@]} class folders; at least 2 are needed" >&2
  exit 1
fi
half=$((${#classes[@]} / 2))
for i in "${!classes[@]}"; do
  split=train
  ((i < half)) || split=test
  mkdir -p "$dst/$split"
  ln -sfn "$src/${classes[$i]}" "$dst/$split/${classes[$i]}"
done
echo "image_folder.sh: $half train and $((${#classes[@]} - half)) test classes under $dst" >&2
