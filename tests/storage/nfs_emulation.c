/* What a writer process sees on NFS, emulated on one machine (loaded with LD_PRELOAD by tests/storage).
 *
 * - write(2) on an O_APPEND descriptor of a regular file reads the file's size, sleeps for one "round
 *   trip" (GUIDELOOM_NFS_APPEND_DELAY_US microseconds) and writes at that size: an NFS client appends
 *   at the size it last saw, so concurrent appends overwrite each other;
 * - flock(2) succeeds and locks nothing (NFS locks may be per machine, or absent);
 * - fsync(2) and fdatasync(2) fail with EIO at their GUIDELOOM_NFS_FSYNC_FAIL_AT-th call in the process
 *   (counted together; 0 or unset: never).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static ssize_t (*real_write)(int, const void *, size_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static long append_delay_us = 0;
static long fsync_fail_at = 0;
static atomic_long fsync_calls = 0;

__attribute__((constructor)) static void load(void) {
    real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    const char *delay = getenv("GUIDELOOM_NFS_APPEND_DELAY_US");
    const char *fail = getenv("GUIDELOOM_NFS_FSYNC_FAIL_AT");
    append_delay_us = delay ? atol(delay) : 0;
    fsync_fail_at = fail ? atol(fail) : 0;
}

ssize_t write(int descriptor, const void *buffer, size_t count) {
    int flags = fcntl(descriptor, F_GETFL);
    struct stat status;
    if (flags == -1 || !(flags & O_APPEND) || fstat(descriptor, &status) != 0 || !S_ISREG(status.st_mode)) {
        return real_write(descriptor, buffer, count);
    }
    off_t seen = status.st_size; /* the size this client last saw */
    if (append_delay_us > 0) {
        struct timespec pause = {append_delay_us / 1000000, (append_delay_us % 1000000) * 1000};
        nanosleep(&pause, NULL);
    }
    /* pwrite on an O_APPEND descriptor appends on Linux: write through a descriptor without it */
    char name[64];
    snprintf(name, sizeof name, "/proc/self/fd/%d", descriptor);
    int plain = open(name, O_WRONLY);
    if (plain < 0) {
        return -1;
    }
    ssize_t written = pwrite(plain, buffer, count, seen);
    int saved = errno;
    close(plain);
    if (written >= 0) {
        lseek(descriptor, seen + written, SEEK_SET);
    }
    errno = saved;
    return written;
}

int flock(int descriptor, int operation) {
    (void)descriptor;
    (void)operation;
    return 0;
}

static int failing(void) {
    long call = atomic_fetch_add(&fsync_calls, 1) + 1;
    if (fsync_fail_at > 0 && call == fsync_fail_at) {
        errno = EIO;
        return 1;
    }
    return 0;
}

int fsync(int descriptor) {
    if (failing()) {
        return -1;
    }
    return real_fsync(descriptor);
}

int fdatasync(int descriptor) {
    if (failing()) {
        return -1;
    }
    return real_fdatasync(descriptor);
}
