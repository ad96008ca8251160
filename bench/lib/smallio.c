/* Small writes, timed, for bench/small_writes.py.
 *
 *   smallio append FILE N        N four-byte O_APPEND writes of 0, 1, ... N-1
 *                                (xfstests generic/069's append_writer), then
 *                                reads the file back and checks every value
 *                                (its append_reader)
 *   smallio write FILE SIZE N    N sequential SIZE-byte writes
 *   smallio syncwrite FILE SIZE N  the same, then fsync
 *
 * Prints "seconds=S" for the writes, the fsync if asked, and the close (the close sends what the
 * file system gathered), and for append "verified=N" or exits 1.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "append") == 0) {
        long n = atol(argv[3]);
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
        if (fd < 0) die("open");
        double t = now();
        for (int i = 0; i < n; i++)
            if (write(fd, &i, sizeof i) != sizeof i) die("write");
        if (close(fd) != 0) die("close");
        printf("seconds=%.6f\n", now() - t);
        fd = open(argv[2], O_RDONLY);
        if (fd < 0) die("open to verify");
        static int buf[65536];
        long seen = 0;
        for (;;) {
            ssize_t got = read(fd, buf, sizeof buf);
            if (got < 0) die("read");
            if (got == 0) break;
            if (got % sizeof(int)) { fprintf(stderr, "short read %zd\n", got); return 1; }
            for (long k = 0; k < got / (long)sizeof(int); k++, seen++)
                if (buf[k] != seen) {
                    fprintf(stderr, "value %ld reads %d\n", seen, buf[k]);
                    return 1;
                }
        }
        close(fd);
        if (seen != n) { fprintf(stderr, "%ld values, want %ld\n", seen, n); return 1; }
        printf("verified=%ld\n", seen);
        return 0;
    }
    if (argc == 5 && (strcmp(argv[1], "write") == 0 || strcmp(argv[1], "syncwrite") == 0)) {
        long size = atol(argv[3]), n = atol(argv[4]);
        char *buf = malloc(size);
        if (!buf) die("malloc");
        memset(buf, 'x', size);
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("open");
        double t = now();
        for (long i = 0; i < n; i++)
            if (write(fd, buf, size) != size) die("write");
        if (argv[1][0] == 's' && fsync(fd) != 0) die("fsync");
        if (close(fd) != 0) die("close");
        printf("seconds=%.6f\n", now() - t);
        return 0;
    }
    fprintf(stderr, "usage: smallio append FILE N | smallio [sync]write FILE SIZE N\n");
    return 2;
}
