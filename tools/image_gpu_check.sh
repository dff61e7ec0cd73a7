#!/bin/bash
# The GPU appliance image's tree checked on a machine with the NVIDIA driver (run as root on the
# GPU machine from the repository root; tools/gpu_session.sh runs it):
#   tools/image_gpu_check.sh BUNDLE_DIR OUT_DIR
# BUNDLE_DIR as tools/gpu_bundle.sh makes it (dsv32, dsv32d, mkmodel, tokenizer.json,
# static/dsv32-init, mkimage). Checks, each one line "ok NAME" or "FAIL NAME: why":
#   nodes    dsv32-init --nvidia-devices plans the driver's own device numbers (this /dev's);
#   image    tools/image_gpu.sh with NVIDIA_LIBS=auto packs libcuda from this machine;
#   ids      dsv32d and dsv32 from the image's tree, through its own loader and libraries,
#            serve the tiny model on the GPU with the same greedy ids as the bundle's binaries;
#   libs     every library they initialise comes from the tree (LD_DEBUG=libs);
#   chroot   dsv32 bench gemm runs chrooted into the tree (its /dev made by dsv32-init).
# The last line: "image_gpu_check: N passed, M failed"; exit status 1 when any failed.
set -u
bundle=$(readlink -f "${1:?usage: tools/image_gpu_check.sh BUNDLE_DIR OUT_DIR}")
out=$(readlink -f "${2:?out dir}")
mkdir -p "$out"
work=$(mktemp -d /tmp/image_gpu_check.XXXXXX)
root=$work/root
pass=0
fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

# nodes: each planned node's number against the one the driver's own /dev has
mkdir -p "$work/dev"
if "$bundle/static/dsv32-init" --nvidia-devices /proc "$work/dev" > "$out/nodes.log" 2>&1; then
  why=
  for n in "$work"/dev/*; do
    real=/dev/$(basename "$n")
    [ -e "$real" ] || continue # the container may not show every node
    [ "$(stat -c %t:%T "$n")" = "$(stat -c %t:%T "$real")" ] || why="$why $(basename "$n")"
  done
  if [ ! -e "$work/dev/nvidiactl" ]; then
    bad nodes "nothing made: $(tail -n 1 "$out/nodes.log")"
  elif [ -n "$why" ]; then
    bad nodes "numbers differ from /dev:$why"
  else
    ok nodes
  fi
else
  bad nodes "dsv32-init --nvidia-devices failed: $(tail -n 1 "$out/nodes.log")"
fi

# image: the tree, with this machine's driver libraries
"$bundle/mkmodel" tiny --seed 1 --out "$work/tiny" --tokenizer "$bundle/tokenizer.json" \
  > "$out/mkmodel.log" 2>&1
NVIDIA_LIBS=auto IMAGE_GPU_ROOT=$root tools/image_gpu.sh "$bundle" "$work/tiny" \
  "$work/gpu.cpio" > "$out/image_gpu.log" 2>&1
if [ $? = 0 ] && [ -e "$root/lib/x86_64-linux-gnu/libcuda.so.1" ]; then
  ok image
else
  bad image "tools/image_gpu.sh: $(tail -n 1 "$out/image_gpu.log")"
fi

# serve NAME DSV32D DSV32 MODEL [LD_DEBUG_OUTPUT]: greedy ids of one request on the CUDA backend
serve() {
  local name=$1 d=$2 c=$3 m=$4 sock=$work/$1.sock dbg= pid i
  [ -n "${5:-}" ] && dbg="env LD_DEBUG=libs LD_DEBUG_OUTPUT=$5"
  $dbg $d --model "$m" --backend cuda --socket "$sock" > "$out/dsv32d_$name.log" 2>&1 &
  pid=$!
  for i in $(seq 1 240); do
    [ -S "$sock" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  timeout 120 $dbg $c generate --socket "$sock" --ids --max-tokens 8 --temperature 0 Hello \
    > "$out/generate_$name.log" 2>&1
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null
  grep -E '^[0-9]+(,[0-9]+)+$' "$out/generate_$name.log" | tail -n 1
}

if [ -x "$root/sbin/dsv32d" ]; then
  loader="$root/lib64/ld-linux-x86-64.so.2 --inhibit-cache --library-path $root/lib/x86_64-linux-gnu"
  host=$(serve host "$bundle/dsv32d" "$bundle/dsv32" "$work/tiny")
  tree=$(serve tree "$loader $root/sbin/dsv32d" "$loader $root/bin/dsv32" \
    "$root/srv/dsv32/model" "$work/lddbg")
  if ! grep -q "cuda backend on GPU" "$out/dsv32d_tree.log"; then
    bad ids "the tree's dsv32d did not start the CUDA backend: $(grep -m1 -E '<3>|error' "$out/dsv32d_tree.log")"
  elif [ -z "$host" ] || [ "$host" != "$tree" ]; then
    bad ids "host '$host', tree '$tree'"
  else
    ok ids
  fi
  cat "$work"/lddbg* 2>/dev/null | grep -o 'calling init: [^ ]*' | sort | uniq -c > "$out/libs.log"
  outside=$(grep -v "calling init: $root/" "$out/libs.log" | awk '{ print $NF }' | tr '\n' ' ')
  if [ ! -s "$out/libs.log" ]; then
    bad libs "no LD_DEBUG output"
  elif [ -n "$outside" ]; then
    bad libs "loaded from outside the tree: $outside"
  elif ! grep -q "libcuda.so.1" "$out/libs.log"; then
    bad libs "libcuda.so.1 was not loaded"
  else
    ok libs
  fi

  # chroot: the tree as the appliance sees it (its own /dev, /proc and /sys)
  if "$bundle/static/dsv32-init" --nvidia-devices /proc "$root/dev" > "$out/chroot.log" 2>&1 &&
     mount --bind /proc "$root/proc" && mount --bind /sys "$root/sys"; then
    timeout 120 chroot "$root" /bin/dsv32 bench gemm --dense --trials 1 --shape 7168x2048 \
      >> "$out/chroot.log" 2>&1
    rc=$?
    umount "$root/sys" "$root/proc" 2>/dev/null
    if [ $rc = 0 ] && grep -q '^ *7168x2048 *4096 ' "$out/chroot.log"; then
      ok chroot
    else
      bad chroot "bench gemm exit status $rc: $(tail -n 1 "$out/chroot.log")"
    fi
  else
    umount "$root/proc" 2>/dev/null
    bad chroot "no device nodes or bind mounts (root needed): $(tail -n 1 "$out/chroot.log")"
  fi
else
  bad ids "no tree"
fi

rm -rf --one-file-system "$work"
echo "image_gpu_check: $pass passed, $fail failed"
[ $fail = 0 ]
