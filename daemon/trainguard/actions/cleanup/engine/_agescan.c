/* The age rules for one batch of names in one directory, in C: agerules.py is the same in
 * Python, and tests/test_cleanup_rules.py keeps the two equal on random trees and times.
 *
 * Python (agepass.py) lists the directory, drops excluded names and mount points, and
 * hands the rest here with the policy's numbers. For each name, with the GIL released:
 * fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW), then the same rules, in the same order and
 * with the same float arithmetic, as agerules._judge_py: other filesystem, directory, type
 * and patterns, grace, open files, age, the max_delete bound and a watermark's need. In delete mode an
 * expired entry that no process has open is deleted by quarantine (quarantine.py says why and
 * how, for both judges): renamed relative to dir_fd to a private name that nothing else uses,
 * checked to be the inode judged, then unlinked (by the next rename onto the private name, or at
 * the end of the batch); anything else found under the private name (a file renamed over the
 * judged name in between) is renamed back and kept. No step follows a symlink. Nothing here
 * decides which names are candidates at all; that stays in Python.
 *
 * Counting (a dry run, the count a max_delete guard makes before anything goes) only reads, so a
 * large batch is split over `threads` threads: the lstats, most of a count's time, then run on
 * several cores, as fd and other parallel walkers do. Deleting stays one entry after another,
 * each lstat right before its own unlink, in the order the bound counts them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

/* HELD_BACK (10) is the Python judge's only; CHANGED: not the inode judged, put back (or, err set, left
 * under its private name). */
enum { IGNORED, IS_DIR, STAT_ERROR, OTHER_DEV, GRACE, YOUNG, OPEN, EXPIRED, UNLINK_ERROR, OVER_BOUND, CHANGED = 11 };
enum { AGE_ATIME = 1, AGE_MTIME = 2, AGE_CTIME = 4 };

typedef struct {
    const char *name;
    PyObject *pyname;  /* the same name, for the test hook */
    int wanted;
    int code;
    int err;
    unsigned long long ino;
    long long bytes;
    double age;
} entry_t;

typedef struct {
    int dir_fd;
    unsigned long long dev;
    int age_mask;  /* 0: st_mtime itself (age_by = ["mtime"]); else the newest of the flagged times */
    double now, older_than, changed_after;
    const uint64_t *open_inos;  /* sorted */
    Py_ssize_t n_open;
    int delete;  /* 0: count (a dry run: an open entry is kept whatever its age); 1: unlink */
    long long max_files, max_bytes;  /* delete: what this batch may still unlink (max_delete), -1: no bound */
    long long need_bytes;  /* delete: stop once this much is freed (a watermark, a size cap), -1: none */
    int listed;  /* count: also hand back the due entries (a listing dry run, the oldest a need takes) */
    long long files, bytes;  /* delete: unlinked so far in this batch */
    PyObject *hook;  /* delete: called ("before_delete", name) just before an entry is quarantined (tests), or NULL */
    int plain_rename;  /* this filesystem refused renameat2's RENAME_NOREPLACE: the placeholder way */
    char priv[64];  /* delete: the private name (quarantine.py) */
    entry_t *held;  /* the entry verified and counted that priv still holds (the next rename onto priv unlinks it) */
    struct stat held_st;
} rule_t;

/* As CPython's os.stat_result fills st_mtime: sec + 1e-9 * nsec, in doubles. */
static double as_float(const struct timespec *t) { return (double)t->tv_sec + 1e-9 * (double)t->tv_nsec; }

static int is_open(const rule_t *r, unsigned long long ino) {
    Py_ssize_t lo = 0, hi = r->n_open;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (r->open_inos[mid] < ino) lo = mid + 1;
        else hi = mid;
    }
    return lo < r->n_open && r->open_inos[lo] == ino;
}

static double age_timestamp(const rule_t *r, const struct stat *st) {
    if (r->age_mask == 0) return as_float(&st->st_mtim);
    double ts = 0.0, t;  /* selection.age_timestamp: max over the fields, from 0.0 */
    if (r->age_mask & AGE_ATIME && (t = as_float(&st->st_atim)) > ts) ts = t;
    if (r->age_mask & AGE_MTIME && (t = as_float(&st->st_mtim)) > ts) ts = t;
    if (r->age_mask & AGE_CTIME && (t = as_float(&st->st_ctim)) > ts) ts = t;
    return ts;
}

/* The private name: quarantine.PREFIX, this process, a counter (quarantine.private_name). */
#define PRIVATE_PREFIX ".trainguard-deleting."
static unsigned long private_seq;

static void private_name(char *buf, size_t size) {
    unsigned long n = __atomic_fetch_add(&private_seq, 1, __ATOMIC_RELAXED);
    snprintf(buf, size, PRIVATE_PREFIX "%lx.%lx", (unsigned long)getpid(), n);
}

/* Rename from to `to` in dir_fd, never replacing an entry at `to`: 0 or an errno. Where the filesystem
 * has no RENAME_NOREPLACE (EINVAL; ENOSYS: an old kernel), `to` is first created empty with O_EXCL
 * (only this call can hold it then), and a plain rename replaces that placeholder. */
static int rename_noreplace(rule_t *r, const char *from, const char *to) {
    if (!r->plain_rename) {
        if (syscall(SYS_renameat2, r->dir_fd, from, r->dir_fd, to, RENAME_NOREPLACE) == 0) return 0;
        if (errno != EINVAL && errno != ENOSYS) return errno;
        r->plain_rename = 1;
    }
    int fd = openat(r->dir_fd, to, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    struct stat mine, now;
    int err = fstat(fd, &mine) != 0 ? errno : 0;
    close(fd);
    if (!err && renameat(r->dir_fd, from, r->dir_fd, to) == 0) return 0;
    if (!err) err = errno;
    if (fstatat(r->dir_fd, to, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == mine.st_dev && now.st_ino == mine.st_ino)
        unlinkat(r->dir_fd, to, 0);  /* the placeholder, still ours */
    return err;
}

static int same_ts(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* What stands under the private name is what was judged (quarantine.same): the rename itself sets the ctime. */
static int same_judged(const rule_t *r, const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT)
        && a->st_size == b->st_size && a->st_nlink == b->st_nlink && same_ts(&a->st_mtim, &b->st_mtim)
        && (!(r->age_mask & AGE_ATIME) || same_ts(&a->st_atim, &b->st_atim));
}

/* Unlink what priv holds, the entry verified last; if that fails, it is not counted as gone after all. */
static void release_held(rule_t *r) {
    entry_t *e = r->held;
    if (e == NULL) return;
    r->held = NULL;
    if (unlinkat(r->dir_fd, r->priv, 0) == 0) return;
    e->code = UNLINK_ERROR;
    e->err = errno;
    r->files--;
    r->bytes -= e->bytes;
}

/* Delete the entry judged from lstat `judged` by quarantine (quarantine.Quarantine.unlink, the same steps):
 * e->code EXPIRED (counted; priv holds it until the next rename onto priv or release_held), UNLINK_ERROR or
 * CHANGED. */
static void quarantine_unlink(rule_t *r, entry_t *e, const struct stat *judged) {
    struct stat st;
    int err;
    entry_t *held = r->held;
    if (held != NULL) {
        err = renameat(r->dir_fd, e->name, r->dir_fd, r->priv) == 0 ? 0 : errno;  /* unlinks what priv held */
    } else {
        err = EEXIST;
        for (int tries = 0; tries < 4 && err == EEXIST; tries++) {  /* EEXIST: a leftover of a crashed run */
            private_name(r->priv, sizeof r->priv);
            err = rename_noreplace(r, e->name, r->priv);
        }
    }
    if (err) {
        e->code = UNLINK_ERROR;
        e->err = err;
        return;
    }
    int found = fstatat(r->dir_fd, r->priv, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (found && same_judged(r, judged, &st)) {
        r->held = e;
        r->held_st = st;
        e->code = EXPIRED;
        return;
    }
    e->code = CHANGED;
    if (held != NULL && found && st.st_dev == r->held_st.st_dev && st.st_ino == r->held_st.st_ino) {
        e->err = 0;  /* the name had become another link of the inode held: the rename did nothing */
        return;
    }
    r->held = NULL;  /* the rename unlinked what priv held (counted already) */
    e->err = rename_noreplace(r, r->priv, e->name);  /* 0: put back; else it stays under priv */
}

static void call_hook(rule_t *r, entry_t *e) {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *res = PyObject_CallFunction(r->hook, "sO", "before_delete", e->pyname);
    if (res == NULL) PyErr_WriteUnraisable(r->hook);
    Py_XDECREF(res);
    PyGILState_Release(gil);
}

static void judge(rule_t *r, entry_t *e) {
    struct stat st;
    for (;;) {
        if (fstatat(r->dir_fd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            e->code = STAT_ERROR;
            e->err = errno;
            return;
        }
        if (r->held == NULL || r->held_st.st_dev != st.st_dev || r->held_st.st_ino != st.st_ino) break;
        release_held(r);  /* another name of the inode held: judged as if that were gone already, as it is next */
    }
    e->ino = st.st_ino;
    if ((unsigned long long)st.st_dev != r->dev) { e->code = OTHER_DEV; return; }
    if (S_ISDIR(st.st_mode)) { e->code = IS_DIR; return; }
    if (!(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) || !e->wanted) { e->code = IGNORED; return; }
    if (as_float(&st.st_mtim) > r->changed_after || as_float(&st.st_ctim) > r->changed_after) {
        e->code = GRACE;
        return;
    }
    e->bytes = st.st_nlink <= 1 ? (long long)st.st_blocks * 512 : 0;
    e->age = r->now - age_timestamp(r, &st);
    if (!r->delete && is_open(r, e->ino)) { e->code = OPEN; return; }  /* a dry run's count is final */
    if (!(e->age >= r->older_than)) { e->code = YOUNG; return; }
    if (!r->delete) { e->code = EXPIRED; return; }
    if (is_open(r, e->ino)) { e->code = OPEN; return; }
    /* max_delete as a hard bound: never more than the guard allowed, even if the tree grew since it was counted */
    if ((r->max_files >= 0 && r->files + 1 > r->max_files) || (r->max_bytes >= 0 && r->bytes + e->bytes > r->max_bytes)
        || (r->need_bytes >= 0 && r->bytes >= r->need_bytes)) {
        e->code = OVER_BOUND;
        return;
    }
    if (r->hook != NULL) call_hook(r, e);
    quarantine_unlink(r, e, &st);
    if (e->code != EXPIRED) return;
    r->files++;
    r->bytes += e->bytes;
}

/* Counting: the entries [lo, hi) of one batch, on a thread of their own. */
typedef struct {
    rule_t *r;
    entry_t *es;
    Py_ssize_t lo, hi;
} span_t;

static void *judge_span(void *arg) {
    span_t *s = arg;
    for (Py_ssize_t i = s->lo; i < s->hi; i++) judge(s->r, &s->es[i]);
    return NULL;
}

enum { MAX_THREADS = 8, MIN_PER_THREAD = 64 };  /* fewer names than this per thread: not worth a thread */

/* judge() every entry; a count of many entries on up to `threads` threads (judge only reads r then). */
static void judge_all(rule_t *r, entry_t *es, Py_ssize_t n, int threads) {
    if (r->delete) threads = 1;
    else if (threads > n / MIN_PER_THREAD) threads = (int)(n / MIN_PER_THREAD);
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 2) {
        for (Py_ssize_t i = 0; i < n; i++) judge(r, &es[i]);
        return;
    }
    span_t spans[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < threads; t++) {
        spans[t] = (span_t){r, es, n * t / threads, n * (t + 1) / threads};
        if (t > 0) started[t] = pthread_create(&ids[t], NULL, judge_span, &spans[t]) == 0;
    }
    for (int t = 0; t < threads; t++)
        if (!started[t]) judge_span(&spans[t]);  /* the first span, and any a thread could not take */
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(ids[t], NULL);
}

/* The Python-side result: (dirs, issues, gone, expired_files, expired_bytes, young, grace). */
static PyObject *collect(PyObject *names, const entry_t *es, Py_ssize_t n, int listed) {
    PyObject *dirs = PyList_New(0), *issues = PyList_New(0), *gone = PyList_New(0), *item;
    long long files = 0, nbytes = 0, young = 0, grace = 0;
    if (!dirs || !issues || !gone) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        const entry_t *e = &es[i];
        PyObject *name = PyList_GET_ITEM(names, i);
        item = NULL;
        switch (e->code) {
        case IS_DIR:
            item = Py_BuildValue("(OK)", name, e->ino);
            if (!item || PyList_Append(dirs, item) < 0) goto fail_item;
            break;
        case STAT_ERROR: case OTHER_DEV: case OPEN: case UNLINK_ERROR: case OVER_BOUND: case CHANGED:
            item = Py_BuildValue("(OiiKL)", name, e->code, e->err, e->ino, e->bytes);
            if (!item || PyList_Append(issues, item) < 0) goto fail_item;
            break;
        case YOUNG: young++; break;
        case GRACE: grace++; break;
        case EXPIRED:
            files++;
            nbytes += e->bytes;
            if (listed) {
                item = Py_BuildValue("(OLd)", name, e->bytes, e->age);
                if (!item || PyList_Append(gone, item) < 0) goto fail_item;
            }
            break;
        default: break;
        }
        Py_XDECREF(item);
    }
    return Py_BuildValue("(NNNLLLL)", dirs, issues, gone, files, nbytes, young, grace);
fail_item:
    Py_XDECREF(item);
fail:
    Py_XDECREF(dirs);
    Py_XDECREF(issues);
    Py_XDECREF(gone);
    return NULL;
}

static PyObject *age_batch(PyObject *self, PyObject *args) {
    rule_t r;
    (void)self;
    PyObject *names, *result = NULL;
    Py_buffer wanted = {0}, open_inos = {0};
    r.max_files = r.max_bytes = r.need_bytes = -1;
    r.listed = 0;
    r.files = r.bytes = 0;
    r.hook = NULL;
    r.plain_rename = 0;
    r.held = NULL;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "iO!z*Kidddy*p|LLLpiO", &r.dir_fd, &PyList_Type, &names, &wanted, &r.dev, &r.age_mask,
                          &r.now, &r.older_than, &r.changed_after, &open_inos, &r.delete, &r.max_files, &r.max_bytes,
                          &r.need_bytes, &r.listed, &threads, &r.hook))
        return NULL;
    if (r.hook == Py_None) r.hook = NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    PyObject **encoded = NULL;
    entry_t *es = NULL;
    if (wanted.buf != NULL && wanted.len != n) {
        PyErr_SetString(PyExc_ValueError, "wanted: one byte per name");
        goto done;
    }
    if (open_inos.len % sizeof(uint64_t) != 0) {
        PyErr_SetString(PyExc_ValueError, "open_inos: an array of uint64");
        goto done;
    }
    r.open_inos = (const uint64_t *)open_inos.buf;
    r.n_open = open_inos.len / (Py_ssize_t)sizeof(uint64_t);
    encoded = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    es = PyMem_Calloc(n ? n : 1, sizeof(entry_t));
    if (!encoded || !es) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "names: a list of str");
            goto done;
        }
        if (!(encoded[i] = PyUnicode_EncodeFSDefault(name))) goto done;
        es[i].name = PyBytes_AS_STRING(encoded[i]);
        es[i].pyname = name;
        es[i].wanted = wanted.buf == NULL || ((const char *)wanted.buf)[i] != 0;
    }
    Py_BEGIN_ALLOW_THREADS
    judge_all(&r, es, n, threads);
    release_held(&r);
    Py_END_ALLOW_THREADS
    result = collect(names, es, n, r.delete || r.listed);
done:
    if (encoded)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(encoded[i]);
    PyMem_Free(encoded);
    PyMem_Free(es);
    PyBuffer_Release(&wanted);
    PyBuffer_Release(&open_inos);
    return result;
}

/* linux_dirent64, as getdents64(2) fills it (glibc < 2.30 has no wrapper). */
struct dirent64_rec {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The names one getdents64 call returns (a few hundred to a thousand), [] at the end of the
 * directory: os.listdir without reading a huge directory into memory at once. */
static PyObject *read_names(PyObject *self, PyObject *args) {
    int fd;
    Py_ssize_t size = 32768;
    long n;
    (void)self;
    if (!PyArg_ParseTuple(args, "i|n", &fd, &size)) return NULL;
    if (size < 1024) size = 1024;  /* room for the longest name */
    char *buf = PyMem_Malloc(size);
    if (!buf) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    n = syscall(SYS_getdents64, fd, buf, (size_t)size);
    Py_END_ALLOW_THREADS
    PyObject *names = n < 0 ? PyErr_SetFromErrno(PyExc_OSError) : PyList_New(0);
    for (long pos = 0; names && pos < n;) {
        const struct dirent64_rec *d = (const struct dirent64_rec *)(buf + pos);
        pos += d->d_reclen;
        if (d->d_name[0] == '.' && (!d->d_name[1] || (d->d_name[1] == '.' && !d->d_name[2]))) continue;
        PyObject *name = PyUnicode_DecodeFSDefault(d->d_name);
        if (!name || PyList_Append(names, name) < 0) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    PyMem_Free(buf);
    return names;
}

static PyMethodDef methods[] = {
    {"read_names", read_names, METH_VARARGS,
     "read_names(dir_fd, size=32768) -> the names one getdents64 call of size bytes reads, [] at the end"},
    {"age_batch", age_batch, METH_VARARGS,
     "age_batch(dir_fd, names, wanted, dev, age_mask, now, older_than, changed_after, open_inos, delete,\n"
     "          max_files=-1, max_bytes=-1, need_bytes=-1, listed=False, threads=1, hook=None)\n"
     "-> (dirs, issues, gone, expired_files, expired_bytes, young, grace)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_agescan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__agescan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "PRIVATE_PREFIX", PRIVATE_PREFIX) < 0) Py_CLEAR(m);
    return m;
}
