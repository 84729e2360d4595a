#!/bin/sh
# /init of the guest tier's initramfs (busybox sh), written into the cpio
# by xtask/src/guest.rs; never run on the host.
#
# Loads the virtio, 9p and overlay modules, mounts the host's root (9p,
# read-only) under a tmpfs overlay (the guest writes anywhere; every write
# is gone at power-off), mounts proc, sys, dev, bpffs, tracefs and cgroup2,
# links /usr/lib/modules/KVER to the extracted kernel so that the kernel's
# module auto-loading finds veth and the rest, and runs the command the
# host left in the io share as PID 1 of the new root; what it keeps goes
# to /run/guest-out (the host's target/guest-out). Its status goes back
# through the io share, then the isa-debug-exit port ends QEMU.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

KVER= KDIR= UPPER=50%
for w in $(cat /proc/cmdline); do
  case "$w" in
    guest.kver=*) KVER=${w#*=} ;;
    guest.kdir=*) KDIR=${w#*=} ;;
    guest.upper=*) UPPER=${w#*=} ;;
  esac
done
die() { echo "guest-init: FATAL: $*"; reboot -f; sleep 10; }

for m in $(cat /mods/order); do
  insmod "/mods/$m.ko" 2>/dev/null || echo "guest-init: insmod $m failed"
done

mkdir -p /lower /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /lower \
  || die "cannot mount the host's root over 9p"
mount -t tmpfs -o mode=755,size=$UPPER tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
  || die "cannot mount the overlay"

R=/newroot
mount --move /proc $R/proc
mount --move /sys $R/sys
mount --move /dev $R/dev
mount -t tmpfs -o mode=755 tmpfs $R/run
mkdir -p $R/dev/pts $R/dev/shm $R/run/guest-io
mount -t devpts -o mode=620,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t bpf bpffs $R/sys/fs/bpf
mount -t tracefs tracefs $R/sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs $R/sys/kernel/debug 2>/dev/null
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 guestio $R/run/guest-io \
  || die "cannot mount the io share"
mkdir -p $R/run/guest-out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 guestout $R/run/guest-out \
  || die "cannot mount the out share"

if [ -n "$KVER" ] && [ -d "$R$KDIR/lib/modules/$KVER" ]; then
  mkdir -p $R/usr/lib/modules
  rm -rf "$R/usr/lib/modules/$KVER"
  ln -s "$KDIR/lib/modules/$KVER" "$R/usr/lib/modules/$KVER"
fi
ip link set lo up
hostname guest

# Stage 2 runs as PID 1 of the new root (switch_root), so that module
# auto-loading (request_module -> /sbin/modprobe) sees the host's kmod.
cp /bin/busybox $R/run/busybox
cat > $R/run/stage2 <<'STAGE2'
#!/bin/bash
stty -F /dev/ttyS0 -onlcr 2>/dev/null
/bin/bash /run/guest-io/cmd.sh </dev/null
echo $? > /run/guest-io/rc.tmp && mv /run/guest-io/rc.tmp /run/guest-io/rc
sync
echo 0 > /proc/sys/kernel/printk
# isa-debug-exit at 0xf4 ends QEMU at once; reboot -f is the fallback.
printf '\001' | /run/busybox dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
/run/busybox reboot -f
sleep 10
STAGE2
exec switch_root $R /bin/bash /run/stage2
die "switch_root failed"
