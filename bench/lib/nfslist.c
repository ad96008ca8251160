/*
 * nfslist: list one directory over NFSv3 with libnfs and time only the listing.
 *
 *   nfslist URL DIR
 *
 *   URL   libnfs URL of the export, e.g. nfs://10.83.0.1/export?version=3&nfsport=2049&mountport=20048
 *   DIR   the directory below the export's root, e.g. /ls/d1000
 *
 * What `nfs-ls URL/DIR` does, with the clock read around the listing alone: nfs_mount (not timed),
 * then nfs_opendir (LOOKUP of DIR's components, READDIRPLUS until EOF; libnfs fetches by LOOKUP
 * the attributes of any entry READDIRPLUS returned without them) and nfs_readdir over every entry
 * (timed). nfs-ls itself cannot be timed this way: its wall time includes process start, the
 * portmapper/MOUNT exchange and printing each entry. Prints one JSON line:
 *   {"entries":N,"secs":S,"mount_secs":M}
 * where N counts every name but "." and "..". Build: gcc -O2 -o nfslist nfslist.c -lnfs
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nfsc/libnfs.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s nfs://server/export?version=3&... /dir/below/export\n", argv[0]);
		return 2;
	}
	struct nfs_context *nfs = nfs_init_context();
	if (!nfs) {
		fprintf(stderr, "nfslist: nfs_init_context failed\n");
		return 1;
	}
	struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
	if (!url) {
		fprintf(stderr, "nfslist: bad URL %s: %s\n", argv[1], nfs_get_error(nfs));
		return 1;
	}
	const char *export = url->path && url->path[0] ? url->path : "/";
	double m0 = now();
	if (nfs_mount(nfs, url->server, export) != 0) {
		fprintf(stderr, "nfslist: mount %s:%s: %s\n", url->server, export, nfs_get_error(nfs));
		return 1;
	}
	double t0 = now();
	struct nfsdir *dir;
	if (nfs_opendir(nfs, argv[2], &dir) != 0) {
		fprintf(stderr, "nfslist: opendir %s: %s\n", argv[2], nfs_get_error(nfs));
		return 1;
	}
	unsigned long n = 0;
	struct nfsdirent *e;
	while ((e = nfs_readdir(nfs, dir)) != NULL) {
		if (strcmp(e->name, ".") && strcmp(e->name, ".."))
			n++;
	}
	double t1 = now();
	nfs_closedir(nfs, dir);
	printf("{\"entries\":%lu,\"secs\":%.6f,\"mount_secs\":%.6f}\n", n, t1 - t0, t0 - m0);
	nfs_destroy_url(url);
	nfs_destroy_context(nfs);
	return 0;
}
