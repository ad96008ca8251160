/* nfsop: one NFSv3 operation through libnfs, for the morris NFS gateway tests.
 *
 * usage: nfsop URL UID GID OP [ARGS...]
 *   URL is an nfs:// directory URL (nfs://127.0.0.1/?version=3&nfsport=P&mountport=P);
 *   its path is the export path mounted (MNT), the op's paths are below it.
 * Prints the result on stdout and exits 0; on failure prints "ERR <errno> <message>"
 * and exits 2; on bad usage exits 64. Ops: see main().
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nlm.h>
#include <nfsc/libnfs-raw-nsm.h>
#include <poll.h>

static struct nfs_context *nfs;

static int fail(int ret) {
    printf("ERR %d %s\n", -ret, nfs_get_error(nfs));
    return 2;
}

/* One raw RPC call's outcome, copied out of libnfs's callback. */
struct waitres {
    int done;
    int status;
    int stat;                       /* nlm4 status */
    unsigned excl, svid;            /* TEST: the holder */
    uint64_t off, len;
};

static void on_connect(struct rpc_context *r, int status, void *data, void *priv) {
    struct waitres *w = priv;
    (void)r; (void)data;
    w->status = status;
    w->done = 1;
}

static void on_res(struct rpc_context *r, int status, void *data, void *priv) {
    struct waitres *w = priv;
    (void)r;
    w->status = status;
    if (status == RPC_STATUS_SUCCESS && data != NULL)
        w->stat = (int)((NLM4_LOCKres *)data)->status; /* LOCK, CANCEL, UNLOCK share the layout */
    w->done = 1;
}

static void on_test(struct rpc_context *r, int status, void *data, void *priv) {
    struct waitres *w = priv;
    (void)r;
    w->status = status;
    if (status == RPC_STATUS_SUCCESS && data != NULL) {
        NLM4_TESTres *t = data;
        w->stat = (int)t->reply.status;
        if (t->reply.status == NLM4_DENIED) {
            nlm4_holder *h = &t->reply.nlm4_testreply_u.lock.holder;
            w->excl = h->exclusive;
            w->svid = h->svid;
            w->off = h->l_offset;
            w->len = h->l_len;
        }
    }
    w->done = 1;
}

/* Runs r until w is done; the call's RPC status. */
static int wait_rpc(struct rpc_context *r, struct waitres *w) {
    while (!w->done) {
        struct pollfd p = { .fd = rpc_get_fd(r), .events = rpc_which_events(r) };
        if (poll(&p, 1, 100) < 0) return -1;
        if (rpc_service(r, p.revents) < 0) return -1;
    }
    return w->status;
}

static const char *nlm_stat_name(int s) {
    static const char *names[] = { "GRANTED", "DENIED", "DENIED_NOLOCKS", "BLOCKED",
        "DENIED_GRACE_PERIOD", "DEADLCK", "ROFS", "STALE_FH", "FBIG", "FAILED" };
    return s >= 0 && s < 10 ? names[s] : "UNKNOWN";
}

/* NLM/NSM ops over a raw connection to SERVER:PORT. a[0] is the op:
 *   nlmlock PATH PORT HOST SVID START LEN EXCL BLOCK [RECLAIM] -> GRANTED | DENIED | BLOCKED | ...
 *   nlmtest PATH PORT HOST SVID START LEN EXCL         -> GRANTED | DENIED excl=E svid=S off=O len=L
 *   nlmunlock PATH PORT HOST SVID START LEN            -> GRANTED | ...
 *   nlmcancel PATH PORT HOST SVID START LEN EXCL       -> GRANTED | ...
 *   nsmnotify - PORT HOST STATE                        -> ok
 */
static int nlm_op(const char *server, const char *op, char **a, int n) {
    if (n < 3) { fprintf(stderr, "%s: too few args\n", op); return 64; }
    struct rpc_context *r = rpc_init_context();
    if (r == NULL) { fprintf(stderr, "no rpc context\n"); return 1; }
    int nsm = !strcmp(op, "nsmnotify");
    struct waitres w = { 0 };
    if (rpc_connect_port_async(r, server, atoi(a[1]), nsm ? NSM_PROGRAM : NLM_PROGRAM,
                               nsm ? NSM_V1 : NLM_V4, on_connect, &w) != 0
        || wait_rpc(r, &w) != RPC_STATUS_SUCCESS) {
        printf("ERR 0 connect: %s\n", rpc_get_error(r));
        return 2;
    }
    memset(&w, 0, sizeof w);
    int ret;
    if (nsm) {
        struct NSM1_NOTIFYargs na = { .mon_name = a[2], .state = atoi(a[3]) };
        ret = rpc_nsm1_notify_async(r, on_res, &na, &w);
        if (ret == 0 && wait_rpc(r, &w) == RPC_STATUS_SUCCESS) { printf("ok\n"); return 0; }
        printf("ERR 0 notify: %s\n", rpc_get_error(r));
        return 2;
    }
    if (n < 6) { fprintf(stderr, "%s: too few args\n", op); return 64; }
    struct nfsfh *fh;
    ret = nfs_open(nfs, a[0], O_RDONLY, &fh);
    if (ret != 0) return fail(ret);
    /* libnfs keeps struct nfs_fh private; in libnfs 4 and 5 it is { int len; char *val; }. */
    struct fh_layout { int len; char *val; } *f = (struct fh_layout *)nfs_get_fh(fh);
    char cookie[4] = { 'c', 'k', 0, 1 };
    nlm4_lock lk = {
        .caller_name = a[2],
        .oh = "owner",
        .svid = (u_int)strtoul(a[3], NULL, 10),
        .l_offset = strtoull(a[4], NULL, 10),
        .l_len = strtoull(a[5], NULL, 10),
    };
    lk.fh.data.data_len = f->len;
    lk.fh.data.data_val = f->val;
    unsigned excl = n > 6 ? (unsigned)atoi(a[6]) : 0;
    if (!strcmp(op, "nlmlock")) {
        if (n < 8) return 64;
        NLM4_LOCKargs la = { .block = (unsigned)atoi(a[7]), .exclusive = excl, .lock = lk, .state = 1,
                             .reclaim = n > 8 ? (unsigned)atoi(a[8]) : 0 };
        la.cookie.data.data_len = 4; la.cookie.data.data_val = cookie;
        ret = rpc_nlm4_lock_async(r, on_res, &la, &w);
    } else if (!strcmp(op, "nlmtest")) {
        NLM4_TESTargs ta = { .exclusive = excl, .lock = lk };
        ta.cookie.data.data_len = 4; ta.cookie.data.data_val = cookie;
        ret = rpc_nlm4_test_async(r, on_test, &ta, &w);
    } else if (!strcmp(op, "nlmunlock")) {
        NLM4_UNLOCKargs ua = { .lock = lk };
        ua.cookie.data.data_len = 4; ua.cookie.data.data_val = cookie;
        ret = rpc_nlm4_unlock_async(r, on_res, &ua, &w);
    } else if (!strcmp(op, "nlmcancel")) {
        NLM4_CANCargs ca = { .block = 1, .exclusive = excl, .lock = lk };
        ca.cookie.data.data_len = 4; ca.cookie.data.data_val = cookie;
        ret = rpc_nlm4_cancel_async(r, on_res, &ca, &w);
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 64;
    }
    if (ret != 0 || wait_rpc(r, &w) != RPC_STATUS_SUCCESS) {
        printf("ERR 0 %s: %s\n", op, rpc_get_error(r));
        return 2;
    }
    if (w.stat == NLM4_DENIED && !strcmp(op, "nlmtest"))
        printf("DENIED excl=%u svid=%u off=%" PRIu64 " len=%" PRIu64 "\n", w.excl, w.svid, w.off, w.len);
    else
        printf("%s\n", nlm_stat_name(w.stat));
    nfs_close(nfs, fh);
    rpc_destroy_context(r);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: nfsop URL UID GID OP [ARGS...]\n");
        return 64;
    }
    nfs = nfs_init_context();
    if (nfs == NULL) {
        fprintf(stderr, "cannot init libnfs\n");
        return 1;
    }
    nfs_set_uid(nfs, atoi(argv[2]));
    nfs_set_gid(nfs, atoi(argv[3]));
    struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
    if (url == NULL) {
        printf("ERR 0 bad url: %s\n", nfs_get_error(nfs));
        return 2;
    }
    int ret = nfs_mount(nfs, url->server, url->path);
    if (ret != 0) {
        printf("ERR %d mount: %s\n", -ret, nfs_get_error(nfs));
        return 2;
    }
    const char *op = argv[4];
    char **a = argv + 5;
    int n = argc - 5;
#define NEED(k) do { if (n < (k)) { fprintf(stderr, "%s needs %d args\n", op, (k)); return 64; } } while (0)
    if (!strncmp(op, "nlm", 3) || !strcmp(op, "nsmnotify")) return nlm_op(url->server, op, a, n);
    if (!strcmp(op, "mkdir")) { NEED(1); ret = nfs_mkdir(nfs, a[0]); }
    else if (!strcmp(op, "mkdirm")) { NEED(2); ret = nfs_mkdir2(nfs, a[0], (int)strtol(a[1], NULL, 8)); }
    else if (!strcmp(op, "rmdir")) { NEED(1); ret = nfs_rmdir(nfs, a[0]); }
    else if (!strcmp(op, "unlink")) { NEED(1); ret = nfs_unlink(nfs, a[0]); }
    else if (!strcmp(op, "rename")) { NEED(2); ret = nfs_rename(nfs, a[0], a[1]); }
    else if (!strcmp(op, "link")) { NEED(2); ret = nfs_link(nfs, a[0], a[1]); }
    else if (!strcmp(op, "symlink")) { NEED(2); ret = nfs_symlink(nfs, a[0], a[1]); }
    else if (!strcmp(op, "truncate")) { NEED(2); ret = nfs_truncate(nfs, a[0], strtoull(a[1], NULL, 10)); }
    else if (!strcmp(op, "chmod")) { NEED(2); ret = nfs_chmod(nfs, a[0], (int)strtol(a[1], NULL, 8)); }
    else if (!strcmp(op, "chown")) { NEED(3); ret = nfs_chown(nfs, a[0], atoi(a[1]), atoi(a[2])); }
    else if (!strcmp(op, "mknod")) { NEED(3); ret = nfs_mknod(nfs, a[0], (int)strtol(a[1], NULL, 8), atoi(a[2])); }
    else if (!strcmp(op, "access")) { NEED(2); ret = nfs_access(nfs, a[0], atoi(a[1])); }
    else if (!strcmp(op, "readlink")) {
        NEED(1);
        char buf[4096];
        memset(buf, 0, sizeof buf);
        ret = nfs_readlink(nfs, a[0], buf, sizeof buf - 1);
        if (ret == 0) printf("%s\n", buf);
    } else if (!strcmp(op, "stat")) {
        NEED(1);
        struct nfs_stat_64 st;
        ret = nfs_stat64(nfs, a[0], &st);
        if (ret == 0)
            printf("mode=%" PRIo64 " size=%" PRIu64 " nlink=%" PRIu64 " uid=%" PRIu64 " gid=%" PRIu64 " ino=%" PRIu64 " blocks=%" PRIu64 "\n",
                   (uint64_t)st.nfs_mode, (uint64_t)st.nfs_size, (uint64_t)st.nfs_nlink,
                   (uint64_t)st.nfs_uid, (uint64_t)st.nfs_gid, (uint64_t)st.nfs_ino,
                   (uint64_t)st.nfs_blocks);
    } else if (!strcmp(op, "statvfs")) {
        NEED(1);
        struct nfs_statvfs_64 sv;
        ret = nfs_statvfs64(nfs, a[0], &sv);
        if (ret == 0)
            printf("bsize=%" PRIu64 " blocks=%" PRIu64 " bfree=%" PRIu64 " files=%" PRIu64 "\n",
                   (uint64_t)sv.f_bsize, (uint64_t)sv.f_blocks, (uint64_t)sv.f_bfree, (uint64_t)sv.f_files);
    } else if (!strcmp(op, "ls")) {
        NEED(1);
        struct nfsdir *dir;
        ret = nfs_opendir(nfs, a[0], &dir);
        if (ret == 0) {
            struct nfsdirent *e;
            while ((e = nfs_readdir(nfs, dir)) != NULL) printf("%s\n", e->name);
            nfs_closedir(nfs, dir);
        }
    } else if (!strcmp(op, "lsi")) {
        /* lsi PATH: one line per entry, in the order listed: NAME INODE TYPE. */
        NEED(1);
        struct nfsdir *dir;
        ret = nfs_opendir(nfs, a[0], &dir);
        if (ret == 0) {
            struct nfsdirent *e;
            while ((e = nfs_readdir(nfs, dir)) != NULL)
                printf("%s %" PRIu64 " %u\n", e->name, e->inode, (unsigned)e->type);
            nfs_closedir(nfs, dir);
        }
    } else if (!strcmp(op, "put")) {
        /* put PATH MODE TEXT: create/truncate and write TEXT, FILE_SYNC via fsync. */
        NEED(3);
        struct nfsfh *fh;
        ret = nfs_open2(nfs, a[0], O_WRONLY | O_CREAT | O_TRUNC, (int)strtol(a[1], NULL, 8), &fh);
        if (ret == 0) {
            size_t len = strlen(a[2]);
            ret = nfs_pwrite(nfs, fh, 0, len, a[2]);
            if (ret >= 0 && (size_t)ret != len) ret = -5;
            if (ret >= 0) ret = nfs_fsync(nfs, fh);
            int c = nfs_close(nfs, fh);
            if (ret >= 0) ret = c;
        }
    } else if (!strcmp(op, "copyin")) {
        /* copyin LOCAL PATH: overwrite (O_TRUNC) an NFS file with a local one, then close. */
        NEED(2);
        FILE *in = fopen(a[0], "rb");
        if (in == NULL) { perror(a[0]); return 64; }
        struct nfsfh *fh;
        ret = nfs_open2(nfs, a[1], O_WRONLY | O_CREAT | O_TRUNC, 0644, &fh);
        if (ret == 0) {
            static char buf[1 << 20];
            uint64_t off = 0;
            size_t got;
            while (ret >= 0 && (got = fread(buf, 1, sizeof buf, in)) > 0) {
                ret = nfs_pwrite(nfs, fh, off, got, buf);
                if (ret >= 0 && (size_t)ret != got) ret = -5;
                off += got;
            }
            int c = nfs_close(nfs, fh);
            if (ret >= 0) ret = c;
        }
        fclose(in);
    } else if (!strcmp(op, "get")) {
        NEED(1);
        struct nfsfh *fh;
        ret = nfs_open(nfs, a[0], O_RDONLY, &fh);
        if (ret == 0) {
            char buf[65536];
            int r = nfs_pread(nfs, fh, 0, sizeof buf - 1, buf);
            if (r < 0) ret = r;
            else { buf[r] = 0; printf("%s\n", buf); }
            nfs_close(nfs, fh);
        }
    } else if (!strcmp(op, "hold")) {
        /* hold PATH: read PATH, print it, wait for a line on stdin, read it
         * again through the same file handle (after e.g. a gateway restart). */
        NEED(1);
        struct nfsfh *fh;
        ret = nfs_open(nfs, a[0], O_RDONLY, &fh);
        if (ret == 0) {
            char buf[4096];
            int r = nfs_pread(nfs, fh, 0, sizeof buf - 1, buf);
            if (r < 0) return fail(r);
            buf[r] = 0;
            printf("%s\n", buf);
            fflush(stdout);
            char line[16];
            if (fgets(line, sizeof line, stdin) == NULL) return 64;
            r = nfs_pread(nfs, fh, 0, sizeof buf - 1, buf);
            if (r < 0) ret = r;
            else { buf[r] = 0; printf("%s\n", buf); }
            nfs_close(nfs, fh);
        }
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 64;
    }
    if (ret < 0) return fail(ret);
    if (strcmp(op, "readlink") && strcmp(op, "stat") && strcmp(op, "statvfs") && strcmp(op, "ls") &&
        strcmp(op, "lsi") && strcmp(op, "get") && strcmp(op, "hold"))
        printf("ok\n");
    nfs_umount(nfs);
    nfs_destroy_url(url);
    nfs_destroy_context(nfs);
    return 0;
}
