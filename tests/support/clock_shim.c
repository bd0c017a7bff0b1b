/*
 * A wall clock that a test can step: an LD_PRELOAD library for redis-server and
 * valkey-server. It adds an offset in microseconds, read from the 8 bytes (a little-endian
 * int64) of the file FAKE_CLOCK_FILE names, to CLOCK_REALTIME, gettimeofday and time; the
 * monotonic clocks are left alone, as NTP leaves them. It reads the clock with the system
 * call itself and allocates nothing, so it cannot deadlock with the server's allocator (as
 * libfaketime does with Debian's jemalloc build). The test rewrites the file in place to
 * step the clock; the shim maps it once and sees each change at once.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_us;

__attribute__((constructor)) static void map_offset(void) {
    const char *path = getenv("FAKE_CLOCK_FILE");
    if (!path) {
        return;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return;
    }
    void *mapped = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped != MAP_FAILED) {
        offset_us = mapped;
    }
}

static int64_t offset(void) {
    return offset_us ? *offset_us : 0;
}

static int real_clock(clockid_t id, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, id, ts);
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset() * 1000;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = real_clock(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) {
        shift(&ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    real_clock(CLOCK_REALTIME, &ts);
    shift(&ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
