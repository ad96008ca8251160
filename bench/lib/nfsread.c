/*
 * nfsread: read one whole file over NFSv3 with libnfs, as one benchmark client.
 *
 *   nfsread [-c CHUNK] [-d DEPTH] [-w] [-s] URL
 *
 *   URL     libnfs URL of the file, e.g. nfs://127.0.0.1/big?version=3&nfsport=P&mountport=P
 *   -c N    bytes per READ call (default 1048576); libnfs splits a call larger than the server's
 *           rtmax into several READs
 *   -d N    READ calls kept in flight (default 1: one synchronous-style reader, like `nfs-cat`)
 *   -w      after mount + open, print "ready" and wait for one line on stdin before reading
 *           (lets a harness start N readers at the same instant)
 *   -s      also compute a checksum of the data (64-bit FNV-1a over 8-byte words) into "sum";
 *           needs -d 1 (the order of completions is not defined with more in flight)
 *
 * Every byte returned is copied into a user buffer, as read(2) would. Prints one JSON line:
 *   {"bytes":..,"secs":..,"mib_s":..,"t0":..,"t1":..,"readmax":..,"size":..,"reads":..,"sum":"...","cpu":..}
 * t0/t1 are CLOCK_MONOTONIC seconds (comparable between processes); cpu is this process's user+sys
 * seconds (getrusage, whole life). Exit status non-zero on any
 * error or short file. Build: gcc -O2 -o nfsread nfsread.c -lnfs
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sys/resource.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nfsc/libnfs.h>

struct req {
	uint64_t off, len;
	struct rd *rd;
};

struct rd {
	struct nfs_context *nfs;
	struct nfsfh *fh;
	uint64_t size, next, done, chunk, reads;
	int inflight, depth, err, checksum;
	char *buf;
	uint64_t sum;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void submit(struct rd *rd, uint64_t off, uint64_t len);

static void read_cb(int status, struct nfs_context *nfs, void *data, void *priv)
{
	struct req *r = priv;
	struct rd *rd = r->rd;
	(void)nfs;
	rd->inflight--;
	if (status < 0) {
		fprintf(stderr, "nfsread: READ at %" PRIu64 ": %s\n", r->off, (char *)data);
		rd->err = 1;
		free(r);
		return;
	}
	if (status == 0) {
		fprintf(stderr, "nfsread: unexpected EOF at %" PRIu64 " of %" PRIu64 "\n", r->off, rd->size);
		rd->err = 1;
		free(r);
		return;
	}
	uint64_t got = (uint64_t)status > r->len ? r->len : (uint64_t)status;
	memcpy(rd->buf, data, got);
	if (rd->checksum) {
		const uint64_t *w = (const uint64_t *)rd->buf;
		uint64_t h = rd->sum;
		for (uint64_t i = 0; i < got / 8; i++) {
			h ^= w[i];
			h *= 1099511628211ULL;
		}
		for (uint64_t i = got / 8 * 8; i < got; i++) {
			h ^= (unsigned char)rd->buf[i];
			h *= 1099511628211ULL;
		}
		rd->sum = h;
	}
	rd->done += got;
	rd->reads++;
	if (got < r->len)
		submit(rd, r->off + got, r->len - got); /* short read: ask for the rest */
	free(r);
	while (!rd->err && rd->inflight < rd->depth && rd->next < rd->size) {
		uint64_t len = rd->size - rd->next < rd->chunk ? rd->size - rd->next : rd->chunk;
		submit(rd, rd->next, len);
		rd->next += len;
	}
}

static void submit(struct rd *rd, uint64_t off, uint64_t len)
{
	struct req *r = malloc(sizeof(*r));
	if (!r) {
		rd->err = 1;
		return;
	}
	r->off = off;
	r->len = len;
	r->rd = rd;
	if (nfs_pread_async(rd->nfs, rd->fh, off, len, read_cb, r) != 0) {
		fprintf(stderr, "nfsread: queueing READ: %s\n", nfs_get_error(rd->nfs));
		rd->err = 1;
		free(r);
		return;
	}
	rd->inflight++;
}

int main(int argc, char **argv)
{
	struct rd rd = {.chunk = 1 << 20, .depth = 1, .sum = 14695981039346656037ULL};
	int wait_go = 0, opt;
	while ((opt = getopt(argc, argv, "c:d:ws")) != -1) {
		switch (opt) {
		case 'c': rd.chunk = strtoull(optarg, NULL, 0); break;
		case 'd': rd.depth = atoi(optarg); break;
		case 'w': wait_go = 1; break;
		case 's': rd.checksum = 1; break;
		default: goto usage;
		}
	}
	if (optind != argc - 1 || rd.chunk == 0 || rd.depth < 1 || (rd.checksum && rd.depth != 1))
		goto usage;

	rd.nfs = nfs_init_context();
	if (!rd.nfs) {
		fprintf(stderr, "nfsread: nfs_init_context failed\n");
		return 1;
	}
	struct nfs_url *url = nfs_parse_url_full(rd.nfs, argv[optind]);
	if (!url) {
		fprintf(stderr, "nfsread: bad URL %s: %s\n", argv[optind], nfs_get_error(rd.nfs));
		return 1;
	}
	/* nfs://host/file gives an empty export path: mount "/" then (some servers refuse ""). */
	const char *export = url->path && url->path[0] ? url->path : "/";
	if (nfs_mount(rd.nfs, url->server, export) != 0) {
		fprintf(stderr, "nfsread: mount %s:%s: %s\n", url->server, export, nfs_get_error(rd.nfs));
		return 1;
	}
	if (nfs_open(rd.nfs, url->file, O_RDONLY, &rd.fh) != 0) {
		fprintf(stderr, "nfsread: open %s: %s\n", url->file, nfs_get_error(rd.nfs));
		return 1;
	}
	struct nfs_stat_64 st;
	if (nfs_fstat64(rd.nfs, rd.fh, &st) != 0) {
		fprintf(stderr, "nfsread: fstat: %s\n", nfs_get_error(rd.nfs));
		return 1;
	}
	rd.size = st.nfs_size;
	rd.buf = malloc(rd.chunk);
	if (!rd.buf) {
		fprintf(stderr, "nfsread: out of memory\n");
		return 1;
	}
	if (wait_go) {
		char line[64];
		printf("ready\n");
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin)) {
			fprintf(stderr, "nfsread: no go line on stdin\n");
			return 1;
		}
	}

	double t0 = now();
	while (rd.inflight < rd.depth && rd.next < rd.size && !rd.err) {
		uint64_t len = rd.size - rd.next < rd.chunk ? rd.size - rd.next : rd.chunk;
		submit(&rd, rd.next, len);
		rd.next += len;
	}
	while (rd.inflight > 0) {
		struct pollfd pfd = {.fd = nfs_get_fd(rd.nfs), .events = nfs_which_events(rd.nfs)};
		if (poll(&pfd, 1, 1000) < 0) {
			if (errno == EINTR)
				continue;
			perror("nfsread: poll");
			return 1;
		}
		if (nfs_service(rd.nfs, pfd.revents) < 0) {
			fprintf(stderr, "nfsread: nfs_service: %s\n", nfs_get_error(rd.nfs));
			return 1;
		}
	}
	double t1 = now();
	if (rd.err || rd.done != rd.size) {
		fprintf(stderr, "nfsread: read %" PRIu64 " of %" PRIu64 " bytes\n", rd.done, rd.size);
		return 1;
	}
	double secs = t1 - t0;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	printf("{\"bytes\":%" PRIu64 ",\"secs\":%.6f,\"mib_s\":%.3f,\"t0\":%.6f,\"t1\":%.6f,\"readmax\":%" PRIu64
	       ",\"size\":%" PRIu64 ",\"reads\":%" PRIu64 ",\"sum\":\"%016" PRIx64 "\",\"cpu\":%.3f}\n",
	       rd.done, secs, rd.done / 1048576.0 / secs, t0, t1, nfs_get_readmax(rd.nfs), rd.size, rd.reads,
	       rd.checksum ? rd.sum : 0, cpu);
	nfs_close(rd.nfs, rd.fh);
	nfs_destroy_url(url);
	nfs_destroy_context(rd.nfs);
	free(rd.buf);
	return 0;

usage:
	fprintf(stderr, "usage: %s [-c CHUNK] [-d DEPTH] [-w] [-s] nfs://server/path/file?version=3&...\n", argv[0]);
	return 2;
}
