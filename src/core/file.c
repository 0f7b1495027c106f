/* Whole reads and writes on file descriptors, retried across EINTR and short transfers. */
#include <errno.h>
#include <unistd.h>

#include "core/core.h"

bool cinfer__read_full(int fd, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}

bool cinfer__pread_full(int fd, void *buf, size_t n, uint64_t offset) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return false;
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return true;
}

bool cinfer__write_full(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0)
            return false;
        if (put == 0) {
            errno = ENOSPC; /* a write that makes no progress: the disk is full */
            return false;
        }
        p += put;
        n -= (size_t)put;
    }
    return true;
}
