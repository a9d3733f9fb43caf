#!/bin/sh
# In-namespace half of tests/sandbox.py; not meant to be run by hand.
#
# Runs as PID 1 of a new PID namespace with a private mount namespace (unshare
# --propagation private), so every mount below is invisible to the host. It hides
# everything on the host that a booting systemd would act on, then execs systemd.
#
#   sandbox_boot.sh DIR CGROUP
#
# DIR     the sandbox directory prepared by Sandbox.boot(): units/, user-units/,
#         conf/journald.conf, conf/system.conf, conf/boot_id, console.log
# CGROUP  path of the sandbox's own cgroup, relative to each hierarchy's root
# $SANDBOX_HIERARCHIES  newline-separated cgroup hierarchy mount points
# $SANDBOX_TMPFS        newline-separated extra directories to cover with a tmpfs
# $SANDBOX_STATE        a directory to bind as /var/lib/systemd (else a tmpfs)
# $SANDBOX_HOSTNAME     the sandbox's node name (else the host's)
set -eu

dir=$1
cgroup=$2

# systemd takes the cgroup it starts in as its root: give it one of its own in every
# hierarchy, so that two sandboxes never share (and kill or account) each other's groups.
while IFS= read -r hierarchy; do
    if [ -n "$hierarchy" ]; then
        mkdir -p "$hierarchy/$cgroup"
        echo $$ >"$hierarchy/$cgroup/cgroup.procs"
    fi
done <<END
${SANDBOX_HIERARCHIES:-}
END

# /run: the manager's state, sockets, transient units and the volatile journal.
mount -t tmpfs -o mode=0755,nosuid,nodev sandbox-run /run
mkdir -p /run/lock /run/systemd/system/sockets.target.wants /run/systemd/system/sysinit.target.wants
ln -s /dev/shm /run/shm

while IFS= read -r path; do
    if [ -n "$path" ]; then
        mount -t tmpfs -o mode=0755 sandbox-tmpfs "$path"
    fi
done <<END
${SANDBOX_TMPFS:-}
END

# The boot id: the kernel keeps one for the whole VM, but this is a boot of its own, and what
# tells boots apart (fleet's claims, the journal) must see a new id, as after a real reboot.
# Read-only, like the kernel's.
mount --bind "$dir/conf/boot_id" /proc/sys/kernel/random/boot_id
mount -o remount,bind,ro /proc/sys/kernel/random/boot_id

# A node name of its own when asked for (the UTS namespace is the sandbox's), also as
# /etc/hostname, which systemd would otherwise set the host's name from at boot.
if [ -n "${SANDBOX_HOSTNAME:-}" ]; then
    echo "$SANDBOX_HOSTNAME" >/proc/sys/kernel/hostname
    if [ -e /etc/hostname ]; then
        mount --bind "$dir/conf/hostname" /etc/hostname
    fi
fi

# /dev: the host's is a shared devtmpfs, where journald would create /dev/log.
mount -t tmpfs -o mode=0755,nosuid sandbox-dev /dev
mknod -m 0666 /dev/null c 1 3
mknod -m 0666 /dev/zero c 1 5
mknod -m 0666 /dev/full c 1 7
mknod -m 0666 /dev/random c 1 8
mknod -m 0666 /dev/urandom c 1 9
mknod -m 0666 /dev/tty c 5 0
mkdir /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts /dev/pts
ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev sandbox-shm /dev/shm
mount -t mqueue mqueue /dev/mqueue || true
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
touch /dev/console
mount --bind "$dir/console.log" /dev/console

# /etc/systemd: nothing of the host's configuration, units or enablement links.
mount -t tmpfs -o mode=0755 sandbox-etc /etc/systemd
mkdir /etc/systemd/system /etc/systemd/user /etc/systemd/journald.conf.d /etc/systemd/system.conf.d
mount --bind "$dir/units" /etc/systemd/system
mount --bind "$dir/user-units" /etc/systemd/user
cp "$dir/conf/journald.conf" /etc/systemd/journald.conf.d/90-fleet-sandbox.conf
cp "$dir/conf/system.conf" /etc/systemd/system.conf.d/90-fleet-sandbox.conf

# Vendor units stay loadable, but nothing pulls them in by itself: no tmpfiles (it would
# empty the host's /tmp), utmp, journal flush, sysusers, timers, and no generators.
for hide in /usr/lib/systemd/system/*.wants /usr/lib/systemd/system-generators; do
    if [ -d "$hide" ]; then
        mount -t tmpfs -o ro,mode=0755 sandbox-hidden "$hide"
    fi
done

# Timer stamps and journal files stay private, and the host's old journal is not read.
# (Existing directories only: creating one here would create it on the host.)
# With $SANDBOX_STATE, a directory kept from one boot to the next (timer stamps survive).
if [ -n "${SANDBOX_STATE:-}" ] && [ -d /var/lib/systemd ]; then
    mount --bind "$SANDBOX_STATE" /var/lib/systemd
elif [ -d /var/lib/systemd ]; then
    mount -t tmpfs -o mode=0755 sandbox-state /var/lib/systemd
fi
if [ -d /var/log/journal ]; then
    mount -t tmpfs -o mode=2755 sandbox-journal /var/log/journal
fi

# What the hidden .wants links normally start: journald, its sockets, and the D-Bus
# socket (systemd-run --wait/--pipe need a bus; it costs nothing until first used).
for unit in systemd-journald.socket systemd-journald-dev-log.socket dbus.socket; do
    if [ -e "/usr/lib/systemd/system/$unit" ]; then
        ln -s "/usr/lib/systemd/system/$unit" "/run/systemd/system/sockets.target.wants/$unit"
    fi
done
ln -s /usr/lib/systemd/system/systemd-journald.service \
    /run/systemd/system/sysinit.target.wants/systemd-journald.service
# The audit socket would feed the host's kernel audit records into every sandbox.
ln -s /dev/null /run/systemd/system/systemd-journald-audit.socket

# Shared propagation within the sandbox, as a booted host has it (systemd makes / shared,
# except in a container): systemd mounts each unit's $CREDENTIALS_DIRECTORY from a namespace
# of its own and relies on it propagating back. The peer groups are new, so nothing reaches
# the host, whose mounts stay private to this namespace (unshare --propagation private).
mount --make-rshared /

cd /
exec env -i container=fleet-sandbox TERM=dumb \
    /usr/lib/systemd/systemd --system --unit=multi-user.target </dev/null
