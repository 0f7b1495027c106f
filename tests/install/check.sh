#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs examples/merge_states.c against
# it twice: through find_package(cinfer) and through pkg-config. Usage: check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/cinfer.h"
test -x "$work/prefix/bin/cinfer"
ls "$work"/prefix/lib*/libcinfer.so >/dev/null
export LD_LIBRARY_PATH="$(dirname "$(ls "$work"/prefix/lib*/libcinfer.so)")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cmake -S "$src/examples" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/merge_states"

# The .pc file finds its prefix from where it lies (relocatable): no --define-prefix needed.
export PKG_CONFIG_PATH="$(dirname "$(ls "$work"/prefix/lib*/pkgconfig/cinfer.pc)")"
cudart_dir=$(dirname "$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ \
  -name 'libcudart.so' 2>/dev/null | head -1)")
cc -std=c11 -Wall -Wextra -Werror "$src/examples/merge_states.c" -o "$work/pc-example" \
  $(pkg-config --cflags --libs cinfer) -L"$cudart_dir" -lcudart -lm
"$work/pc-example"
"$work/prefix/bin/cinfer" --version
echo "install check: ok"
