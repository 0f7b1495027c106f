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

# With the AOT bundle installed next to the library, attention runs with the JIT switched off:
# every kernel of the batch decode example comes from the bundle (on a GPU; without one the
# example says so).
if [ -f "$build/libcinfer.aot" ]; then
  ls "$work"/prefix/lib*/libcinfer.aot >/dev/null
  CINFER_JIT=off CINFER_CACHE_DIR="$work/empty-cache" "$work/cmake-build/batch_decode"
fi

# The .pc file finds its prefix from where it lies (relocatable): no --define-prefix needed.
export PKG_CONFIG_PATH="$(dirname "$(ls "$work"/prefix/lib*/pkgconfig/cinfer.pc)")"
cudart_dir=$(dirname "$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ \
  -name 'libcudart.so' 2>/dev/null | head -1)")
cc -std=c11 -Wall -Wextra -Werror "$src/examples/merge_states.c" -o "$work/pc-example" \
  $(pkg-config --cflags --libs cinfer) -L"$cudart_dir" -lcudart -lm
"$work/pc-example"
"$work/prefix/bin/cinfer" --version

# The Python wheel made from the install (library and bundle inside the package), installed into
# a folder of its own and imported from there; on a GPU with torch it runs decode with the JIT
# off. Needs pip, setuptools and wheel (no network: no build isolation).
if python3 -c "import setuptools, wheel, pip" 2>/dev/null; then
  cp -r "$src/python" "$work/pysrc"
  rm -rf "$work/pysrc/build" "$work/pysrc"/*.egg-info
  cp -L "$(ls "$work"/prefix/lib*/libcinfer.so)" "$work/pysrc/cinfer/"
  if [ -f "$build/libcinfer.aot" ]; then cp "$(ls "$work"/prefix/lib*/libcinfer.aot)" "$work/pysrc/cinfer/"; fi
  python3 -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/pysrc" >/dev/null
  python3 -m pip install -q --no-deps --target "$work/py" "$work"/dist/cinfer-*.whl >/dev/null
  env -u CINFER_LIBRARY PYTHONPATH="$work/py" CINFER_JIT=off CINFER_CACHE_DIR="$work/empty-cache" \
    python3 "$src/tests/install/wheel_check.py" "$work/py"
else
  echo "wheel check: skipped (python3 lacks pip, setuptools or wheel)"
fi
echo "install check: ok"
