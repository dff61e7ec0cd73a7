#!/bin/bash
# The appliance image booted for real: build/image/dsv32.cpio as the initramfs of a Linux kernel
# under QEMU (software emulation unless DSV32_QEMU_ACCEL says otherwise), dsv32-init as PID 1.
# The kernel command line asks it (dsv32.ready, dsv32.ready-done) to run a greedy request
# through the real client once dsv32d is ready, then the server's statistics, then power off.
# A boot passes when the machine powers itself off with every step seen on the serial console
# and the request's token ids equal those of the same request to the same model on this
# machine (the host's dsv32-init, dsv32d and client): the static musl programs in the image
# compute what the host's do. Two boots, two tests:
#   image.boots_serves_and_powers_off  the image as built (the model inside it);
#   image.serves_a_checkpoint_on_a_disk  the model on an ext4 virtio disk instead, with a second
#       archive appended to the initramfs (the kernel unpacks both) that brings the disk's kernel
#       modules and an init.conf loading them and mounting the disk read-only.
#   image.gpu_image_serves_on_the_cpu_without_a_driver  the GPU image (tools/image_gpu.sh,
#       without the NVIDIA libraries: none here): the glibc dsv32d and dsv32 with the C library
#       packed beside them, no driver found (no device nodes, backend auto -> the CPU backend),
#       and the same ids.
#   tests/image/boot_test.sh BUILD_DIR   (prints "ok    image.NAME (N s)" or "FAIL  ..." for
#   each; exit status: the number that failed)
# Environment: DSV32_KERNEL, DSV32_KERNEL_MODULES (a kernel image and a directory of modules
# with an `order` file; default: tools/fetch_kernel.sh BUILD_DIR/kernel), DSV32_QEMU_ACCEL (tcg,
# the default, or kvm), BOOT_TIMEOUT (seconds a boot, default 600).
set -u
build=${1:-build}
image=$build/image/dsv32.cpio
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { # NAME REASON: prints the failure and the console's last lines
  echo "FAIL  $1: $2"
  [ -f "$work/console.log" ] && tail -n 60 "$work/console.log" | sed 's/^/    /'
  failed=$((failed + 1))
}

setup() { # the kernel, the expected ids; a reason on stdout when it cannot be done
  command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"; return 1; }
  [ -s "$image" ] || { echo "$image not built (make image)"; return 1; }
  kernel=${DSV32_KERNEL:-}
  modules=${DSV32_KERNEL_MODULES:-}
  if [ -z "$kernel" ]; then
    tools/fetch_kernel.sh "$build/kernel" > "$work/kernel.log" 2>&1 || { echo "no kernel: $(cat "$work/kernel.log")"; return 1; }
    kernel=$build/kernel/vmlinuz
    modules=$build/kernel/modules
  fi
  # The expected ids: the same request on this machine, through the host's own build
  model=$(realpath "$build/image/root/srv/dsv32/model")
  cat > "$work/d.conf" <<EOF
model = $model
backend = cpu
socket = $work/d.sock
host-memory-mb = 256
EOF
  cat > "$work/init.conf" <<EOF
exec = $(realpath "$build/dsv32d") --config $work/d.conf
runtime-directory =
ready = $(realpath "$build/dsv32") generate --socket $work/d.sock $gen
ready-done = poweroff
EOF
  timeout 120 "$build/dsv32-init" --conf "$work/init.conf" --notify "$work/notify" \
    > "$work/host.log" 2>&1 || { echo "the host run: $(tail -n 20 "$work/host.log")"; return 1; }
  want=$(grep -E '^[0-9]+(,[0-9]+){7}$' "$work/host.log" | head -n 1)
  [ -n "$want" ] || { echo "the host run printed no ids: $(tail -n 20 "$work/host.log")"; return 1; }
}

boot() { # NAME INITRD [QEMU ARGS...]: boots, checks the console; 0 or a failure reported
  local name=$1 initrd=$2 t0 rc got line
  shift 2
  t0=$(date +%s)
  rm -f "$work/console.log"
  timeout "${BOOT_TIMEOUT:-600}" qemu-system-x86_64 -accel "${DSV32_QEMU_ACCEL:-tcg}" -m 1536 \
    -smp 2 -nodefaults -display none -no-reboot -serial "file:$work/console.log" -monitor none \
    -kernel "$kernel" -initrd "$initrd" "$@" \
    -append "console=ttyS0 panic=-1 dsv32.ready=\"/bin/dsv32 generate $gen\" dsv32.ready=\"/bin/dsv32 stats\" dsv32.ready-done=poweroff" \
    > "$work/qemu.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && { fail "$name" "still running after ${BOOT_TIMEOUT:-600} s"; return; }
  [ $rc -eq 0 ] || { fail "$name" "qemu exited with status $rc: $(cat "$work/qemu.log")"; return; }
  for line in "${expect[@]}" "Run /init as init process" "dsv32-init: dsv32 appliance starting" \
      "dsv32-init: service ready" "completion tokens" "decode_tokens" \
      "ready commands: 2 of 2 succeeded" "exited with status 0" "dsv32-init: powering off" \
      "reboot: Power down"; do
    grep -qF "$line" "$work/console.log" || { fail "$name" "the console never showed \"$line\""; return; }
  done
  got=$(tr -d '\r' < "$work/console.log" | grep -E '^[0-9]+(,[0-9]+){7}$' | head -n 1)
  [ "$got" = "$want" ] || { fail "$name" "token ids in the image $got, on this machine $want"; return; }
  echo "ok    $name ($(( $(date +%s) - t0 )) s; ids $got)"
}

gen="--ids --max-tokens 8 --temperature 0 Hello"
if ! setup > "$work/setup.log"; then
  fail image.boots_serves_and_powers_off "$(cat "$work/setup.log")"
  fail image.serves_a_checkpoint_on_a_disk "$(cat "$work/setup.log")"
  fail image.gpu_image_serves_on_the_cpu_without_a_driver "$(cat "$work/setup.log")"
  exit $failed
fi

# 1. the image as built
expect=("/srv/dsv32/model: 4 layers")
boot image.boots_serves_and_powers_off "$image"

# 2. the checkpoint on a disk: an ext4 image of the model (mkfs.ext4 -d, no root needed), and
# an archive after the image's with the modules and the configuration that use it
name=image.serves_a_checkpoint_on_a_disk
if [ ! -s "$modules/order" ]; then
  fail $name "no kernel modules in ${modules:-(DSV32_KERNEL_MODULES unset)}"
elif ! PATH=$PATH:/sbin:/usr/sbin command -v mkfs.ext4 >/dev/null; then
  fail $name "mkfs.ext4 not found (apt-get install e2fsprogs)"
else
  mkdir -p "$work/disk/dsv32" "$work/over/etc/dsv32" "$work/over/lib/modules"
  cp "$model"/*.json "$model"/*.safetensors "$work/disk/dsv32/"
  mb=$(( $(du -sm "$work/disk" | cut -f1) * 12 / 10 + 32 ))
  if ! PATH=$PATH:/sbin:/usr/sbin mkfs.ext4 -q -F -L dsv32 -d "$work/disk" "$work/disk.img" \
      "${mb}M" > "$work/mkfs.log" 2>&1; then
    fail $name "mkfs.ext4: $(cat "$work/mkfs.log")"
    exit $failed
  fi
  {
    echo "exec = /sbin/dsv32d --config /etc/dsv32/dsv32d.conf --model /srv/models/dsv32"
    while read -r m; do
      cp "$modules/$m" "$work/over/lib/modules/"
      echo "module = /lib/modules/$m"
    done < "$modules/order"
    echo "mount = /dev/vda /srv/models ext4 ro"
  } > "$work/over/etc/dsv32/init.conf"
  rm -rf "$work/disk"
  if "$build/mkimage" --out "$work/over.cpio" --tree "$work/over" > "$work/mkimage.log" 2>&1; then
    cat "$image" "$work/over.cpio" > "$work/both.cpio"
    expect=("mounted /dev/vda on /srv/models (ext4)" "/srv/models/dsv32: 4 layers")
    boot $name "$work/both.cpio" -drive "file=$work/disk.img,if=virtio,format=raw,readonly=on"
  else
    fail $name "mkimage: $(cat "$work/mkimage.log")"
  fi
fi

# 3. the GPU image with no driver in it
name=image.gpu_image_serves_on_the_cpu_without_a_driver
rm -f "$work/both.cpio" "$work/disk.img"
if NVIDIA_LIBS=none IMAGE_GPU_ROOT="$work/gpuroot" tools/image_gpu.sh "$build" "$model" \
    "$work/gpu.cpio" > "$work/image_gpu.log" 2>&1; then
  rm -rf "$work/gpuroot"
  expect=("nvidia-devices: no NVIDIA driver in /proc/devices" "backend auto: no NVIDIA driver"
          "using the CPU backend" "/srv/dsv32/model: 4 layers")
  boot $name "$work/gpu.cpio"
else
  fail $name "tools/image_gpu.sh: $(cat "$work/image_gpu.log")"
fi
exit $failed
