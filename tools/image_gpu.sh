#!/bin/bash
# The GPU appliance image (`make image-gpu`): an initramfs whose PID 1 is the static dsv32-init,
# serving with the glibc builds of dsv32d and dsv32 (static but for the C library, which the
# NVIDIA driver's libcuda needs), the C library they and the driver's libraries load, the
# driver's user-space libraries, and, when given, its kernel modules and firmware. dsv32-init
# loads the modules, makes the driver's device nodes (nvidia-devices = on) and starts dsv32d
# with backend = auto: the GPU when the driver finds one, else the CPU backend, saying why.
#
# The driver's pieces must be those of one driver version, and the modules built for the
# kernel that boots the image: build the image on a machine with that driver installed.
#
# Usage: tools/image_gpu.sh BUILD_DIR MODEL_DIR OUT.cpio
# Environment:
#   NVIDIA_LIBS      auto (default): the libraries below where this machine's loader finds them
#                    (ldconfig -p), then /usr/local/cuda/lib64; none: no driver libraries (the
#                    image then runs the CPU backend: what `make test` boots); or directories
#                    (colon-separated) searched first, before the auto places
#   NVIDIA_MODULES   a directory with nvidia.ko and nvidia-uvm.ko for the image's kernel
#   NVIDIA_FIRMWARE  the driver's firmware directory (e.g. /lib/firmware/nvidia/580.95.05), packed
#                    at the same path (the open modules load their GSP firmware from it)
#   IMAGE_GPU_ROOT   where the image's tree is assembled (default: OUT's directory/root)
# Prints what it packed and from where, and what it did not find.
set -eu
build=${1:?usage: tools/image_gpu.sh BUILD_DIR MODEL_DIR OUT.cpio}
model=${2:?model dir}
out=${3:?out.cpio}
root=${IMAGE_GPU_ROOT:-$(dirname "$out")/root}
top=$(dirname "$0")/.. # the repository: dist/image/
libs_from=${NVIDIA_LIBS:-auto}
libdir=/lib/x86_64-linux-gnu # a directory the glibc loader searches by itself (no ld.so.cache)

# The driver's libraries dsv32 opens: libcuda.so.1 (the driver API), the PTX JIT compiler
# libcuda opens where it compiles our embedded PTX (on sm_90 the embedded cubins load and it is
# not opened: driver 580, docs/PERF.md session 38), NVML (the benches' energy), cuBLASLt (the
# prefill GEMMs' peer and the dispatch's other choice).
driver_libs="libcuda.so.1 libnvidia-ptxjitcompiler.so.1 libnvidia-ml.so.1 libcublasLt.so.13"

for f in "$build/dsv32d" "$build/dsv32" "$build/static/dsv32-init" "$build/mkimage" "$model/config.json"; do
  [ -e "$f" ] || { echo "image_gpu: $f is missing (make all static; a model in $model)" >&2; exit 1; }
done
rm -rf "$root"
mkdir -p "$root"/{sbin,bin,etc/dsv32,dev,proc,sys,run,tmp,srv/dsv32/model,lib64,$libdir}

cp "$build/static/dsv32-init" "$root/init"
cp "$build/dsv32d" "$root/sbin/dsv32d"
cp "$build/dsv32" "$root/bin/dsv32"
strip "$root/init" "$root/sbin/dsv32d" "$root/bin/dsv32"
cp -l "$model"/*.json "$model"/*.safetensors "$root/srv/dsv32/model/" 2>/dev/null ||
  cp "$model"/*.json "$model"/*.safetensors "$root/srv/dsv32/model/"

# where the loader of this machine would find a library by its soname
find_lib() {
  local name=$1 d
  if [ "$libs_from" != auto ]; then
    local IFS=:
    for d in $libs_from; do [ -e "$d/$name" ] && { echo "$d/$name"; return; }; done
  fi
  d=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')
  [ -n "$d" ] && { echo "$d"; return; }
  [ -e "/usr/local/cuda/lib64/$name" ] && echo "/usr/local/cuda/lib64/$name"
  true
}

packed=
# a library into the image under its soname (the file it links to, not the link)
pack_lib() { # NAME PATH
  [ -e "$root$libdir/$1" ] && return
  cp -L "$2" "$root$libdir/$1"
  packed="$packed $1"
  echo "image_gpu: packed $1 from $(readlink -f "$2")"
}

if [ "$libs_from" != none ]; then
  for name in $driver_libs; do
    p=$(find_lib "$name")
    if [ -n "$p" ]; then pack_lib "$name" "$p"; else echo "image_gpu: not found: $name"; fi
  done
fi

# Everything those load: the loader's own answer (ldd) for each program and library, until
# nothing new comes (libraries' dependencies included). The interpreter at its PT_INTERP path.
# A library the loader cannot find is refused here, not at the first boot.
missing=
while :; do
  new=0
  for f in "$root/sbin/dsv32d" "$root/bin/dsv32" "$root$libdir"/*; do
    [ -f "$f" ] || continue
    while read -r name arrow path _; do
      if [ "$arrow" = "=>" ] && [ "$path" = not ]; then
        missing="$missing $name (for ${f#$root})"
      elif [ "$arrow" = "=>" ] && [ -e "$path" ] && [ ! -e "$root$libdir/$name" ]; then
        pack_lib "$name" "$path"
        new=1
      elif [ "${name#/}" != "$name" ] && [ -e "$name" ] && [ ! -e "$root$name" ]; then
        mkdir -p "$root$(dirname "$name")"
        cp -L "$name" "$root$name"
        echo "image_gpu: packed the loader $name"
      fi
    done < <(ldd "$f" 2>/dev/null | grep -v 'linux-vdso\|statically linked\|not a dynamic')
  done
  [ $new = 1 ] || break
done
[ -z "$missing" ] || { echo "image_gpu: unresolved:$missing" >&2; exit 1; }

modules=
if [ -n "${NVIDIA_MODULES:-}" ]; then
  mkdir -p "$root/lib/modules/nvidia"
  for m in nvidia nvidia-uvm; do
    [ -e "$NVIDIA_MODULES/$m.ko" ] || { echo "image_gpu: $NVIDIA_MODULES/$m.ko is missing" >&2; exit 1; }
    cp "$NVIDIA_MODULES/$m.ko" "$root/lib/modules/nvidia/"
    modules="$modules$(printf '\nmodule = /lib/modules/nvidia/%s.ko' "$m")"
    echo "image_gpu: packed the module $m.ko"
  done
fi
if [ -n "${NVIDIA_FIRMWARE:-}" ]; then
  fw=$(readlink -f "$NVIDIA_FIRMWARE")
  mkdir -p "$root$fw"
  cp -r "$fw"/. "$root$fw/"
  echo "image_gpu: packed the firmware $fw"
fi

cp "$top/dist/image/dsv32d-gpu.conf" "$root/etc/dsv32/dsv32d.conf"
{
  cat "$top/dist/image/init.conf"
  printf '#\n# The GPU image (tools/image_gpu.sh): the NVIDIA modules packed into it, in order, then\n'
  printf '# the driver'"'"'s device nodes.%s\nnvidia-devices = on\n' "$modules"
} > "$root/etc/dsv32/init.conf"

"$build/mkimage" --out "$out" --tree "$root" --nod /dev/console:c:5:1:0600 --nod /dev/null:c:1:3:0666
echo "image_gpu: $out ($(du -sh "$out" | cut -f1)); libraries:${packed:- none}"
[ -e "$root$libdir/libcuda.so.1" ] ||
  echo "image_gpu: no libcuda.so.1 in the image: it runs the CPU backend (NVIDIA_LIBS)"
