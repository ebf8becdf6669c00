/* The record walk of kafka_source.wire.format.fast_decode in C: record boundaries and fields.
 *
 * Why C: a magic-2 record starts with its own length, so the records of a batch form a chain
 * that can only be followed one record after the other. numpy follows many chains in lockstep
 * (fast_decode._chains, _fields_fast), at about 170 ns per record; a plain loop over the bytes
 * takes a few ns. On two cores the decoder's CPU is taken from Spark's JVM (issue 20), so it is
 * what stands between a batch read and PySpark's own floor.
 *
 * What it does is exactly what fast_decode._chains + _fields_fast do, and nothing more clever:
 *
 *   walk(buf, sec_start, sec_end, counts, st, en, tsd, od, ks, ke, knull, vs, ve, vnull, ok,
 *        batch_ok)
 *
 * buf is the chunk (bytes-like); sec_start/sec_end/counts (int64, one per batch) locate each
 * batch's records section in it and give its record count. The other arguments are writable
 * outputs, one element per record (batch-major; the records of batch b are at
 * sum(counts[:b]) ...) except batch_ok (one per batch); positions are absolute in buf:
 *
 *   st, en     record start (its length varint) and end;
 *   tsd, od    timestamp delta and offset delta;
 *   ks, ke     key bytes [ks, ke); knull: key length negative (null key);
 *   vs, ve     value bytes; vnull: value length negative;
 *   ok         the record was decoded here (1): varints of at most 8 bytes, no headers, fields
 *              ending exactly at the record's end. Otherwise 0 and only st/en are meaningful
 *              (the positions are set to st, the rest to 0): the caller's general path decodes
 *              it (headers) or finds it malformed;
 *   batch_ok   the chain of the batch is well formed: count records, each with a length that
 *              fits, the last ending on sec_end. A batch that is not (0) is left to the reference
 *              decoder, which raises its error; its records get st = en = ks = ke = vs = ve =
 *              sec_start and ok = 1, so that positions stay non-decreasing.
 *
 * Anything unusual is never judged here, only handed on: a varint of more than 8 bytes or a
 * timestamp delta of 2**52 or more makes the record (or, for a length, the batch) go to the
 * Python paths that hold the rules (fast_decode's limits, records.py's errors). Every read is
 * bounded by the record's end (fields) or the section's end (lengths); the caller checks that the
 * sections lie inside buf and that the outputs are large enough.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_VARINT_BYTES 8            /* fast_decode._VARINT_MAX_BYTES: |value| < 2**55 */
#define TS_SAFE (((int64_t)1) << 52)  /* fast_decode._TS_SAFE */

/* A zigzag varint of at most MAX_VARINT_BYTES at p, not reading at or past lim.
 * Returns the bytes it takes (1..8), or 0 if it is longer or runs into lim. */
static inline int read_varint(const uint8_t *p, const uint8_t *lim, int64_t *out)
{
    uint64_t raw = 0;
    int i;
    for (i = 0; i < MAX_VARINT_BYTES; i++) {
        if (p + i >= lim)
            return 0;
        uint8_t b = p[i];
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return i + 1;
        }
    }
    return 0;
}

/* A length-prefixed byte field (key or value) at *q, inside [*q, rend): its bytes are
 * [*start, *end) in buf, *null when the length is negative; *q moves past it. 0 if the length
 * is not a short varint or the bytes run past rend (the outputs are then left as they were). */
static inline int read_bytes(const uint8_t **q, const uint8_t *rend, const uint8_t *buf,
                             int64_t *start, int64_t *end, uint8_t *null)
{
    int64_t len;
    int sz = read_varint(*q, rend, &len);
    if (sz == 0)
        return 0;
    const uint8_t *p = *q + sz;
    if (len > 0 && len > rend - p)
        return 0;
    *start = p - buf;
    if (len > 0)
        p += len;
    *end = p - buf;
    *null = len < 0;
    *q = p;
    return 1;
}

typedef struct {
    Py_buffer view;
    int used;
} Buf;

static int get_buffer(PyObject *obj, Buf *b, int writable, Py_ssize_t need, Py_ssize_t item,
                      const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0)
        return -1;
    b->used = 1;
    if (b->view.len < need * item) {
        PyErr_Format(PyExc_ValueError, "_recwalk.walk: %s holds %zd bytes, needs %zd", name,
                     b->view.len, need * item);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i].used)
            PyBuffer_Release(&bufs[i].view);
}

enum { B_BUF, B_SS, B_SE, B_CNT, B_ST, B_EN, B_TSD, B_OD, B_KS, B_KE, B_KN, B_VS, B_VE, B_VN,
       B_OK, B_BOK, NBUF };

static PyObject *walk(PyObject *self, PyObject *args)
{
    PyObject *o[NBUF];
    Buf b[NBUF];
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14],
                          &o[15]))
        return NULL;
    if (get_buffer(o[B_BUF], &b[B_BUF], 0, 0, 1, "buf") < 0 ||
        get_buffer(o[B_SS], &b[B_SS], 0, 0, 8, "sec_start") < 0)
        goto fail;
    Py_ssize_t nb = b[B_SS].view.len / 8;
    if (get_buffer(o[B_SE], &b[B_SE], 0, nb, 8, "sec_end") < 0 ||
        get_buffer(o[B_CNT], &b[B_CNT], 0, nb, 8, "counts") < 0)
        goto fail;

    const uint8_t *buf = (const uint8_t *)b[B_BUF].view.buf;
    const Py_ssize_t size = b[B_BUF].view.len;
    const int64_t *ss = (const int64_t *)b[B_SS].view.buf;
    const int64_t *se = (const int64_t *)b[B_SE].view.buf;
    const int64_t *cnt = (const int64_t *)b[B_CNT].view.buf;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < nb; i++) {
        if (cnt[i] < 0 || ss[i] < 0 || se[i] < ss[i] || se[i] > size) {
            PyErr_Format(PyExc_ValueError, "_recwalk.walk: batch %zd: bad section [%lld, %lld) "
                         "or count %lld in a %zd-byte buffer", i, (long long)ss[i],
                         (long long)se[i], (long long)cnt[i], size);
            goto fail;
        }
        n += (Py_ssize_t)cnt[i];
    }
    static const char *names[NBUF] = {0, 0, 0, 0, "st", "en", "tsd", "od", "ks", "ke", "knull",
                                      "vs", "ve", "vnull", "ok", "batch_ok"};
    for (int k = B_ST; k < NBUF; k++) {
        int one = (k == B_KN || k == B_VN || k == B_OK || k == B_BOK);
        if (get_buffer(o[k], &b[k], 1, k == B_BOK ? nb : n, one ? 1 : 8, names[k]) < 0)
            goto fail;
    }
    int64_t *st = b[B_ST].view.buf, *en = b[B_EN].view.buf, *tsd = b[B_TSD].view.buf,
            *od = b[B_OD].view.buf, *ks = b[B_KS].view.buf, *ke = b[B_KE].view.buf,
            *vs = b[B_VS].view.buf, *ve = b[B_VE].view.buf;
    uint8_t *knull = b[B_KN].view.buf, *vnull = b[B_VN].view.buf, *ok = b[B_OK].view.buf,
            *bok = b[B_BOK].view.buf;

    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t r = 0;
    for (Py_ssize_t bi = 0; bi < nb; bi++) {
        const int64_t count = cnt[bi];
        const Py_ssize_t r0 = r;
        const uint8_t *p = buf + ss[bi];
        const uint8_t *end = buf + se[bi];
        int good = 1;
        for (int64_t i = 0; i < count; i++, r++) {
            int64_t len;
            int sz = read_varint(p, end, &len);
            if (sz == 0 || len < 0 || len > end - (p + sz)) {
                good = 0;
                break;
            }
            const uint8_t *rend = p + sz + len;
            st[r] = p - buf;
            en[r] = rend - buf;
            /* Fields; any surprise clears ok and the general path looks again. */
            const uint8_t *q = p + sz + 1;            /* past the attributes byte */
            int fine = q <= rend;
            int64_t t = 0, o = 0, hc = 0;
            if (fine && (sz = read_varint(q, rend, &t)) && t < TS_SAFE && t > -TS_SAFE)
                q += sz;
            else
                fine = 0;
            if (fine && (sz = read_varint(q, rend, &o)))
                q += sz;
            else
                fine = 0;
            fine = fine && read_bytes(&q, rend, buf, &ks[r], &ke[r], &knull[r]);
            fine = fine && read_bytes(&q, rend, buf, &vs[r], &ve[r], &vnull[r]);
            if (fine && (sz = read_varint(q, rend, &hc)) && hc == 0 && q + sz == rend) {
                tsd[r] = t;
                od[r] = o;
                ok[r] = 1;
            } else {
                /* A field read may have stopped half way: none of them is kept. */
                ks[r] = ke[r] = vs[r] = ve[r] = st[r];
                tsd[r] = od[r] = 0;
                knull[r] = vnull[r] = 0;
                ok[r] = 0;
            }
            p = rend;
        }
        if (good && p != end)
            good = 0;
        bok[bi] = (uint8_t)good;
        if (!good) {
            const int64_t s0 = ss[bi];
            for (Py_ssize_t j = r0; j < r0 + (Py_ssize_t)count; j++) {
                st[j] = en[j] = ks[j] = ke[j] = vs[j] = ve[j] = s0;
                tsd[j] = od[j] = 0;
                knull[j] = vnull[j] = 0;
                ok[j] = 1;
            }
            r = r0 + (Py_ssize_t)count;
        }
    }
    Py_END_ALLOW_THREADS

    release(b, NBUF);
    Py_RETURN_NONE;
fail:
    release(b, NBUF);
    return NULL;
}


/* gather(buf, starts, ends, sel, offsets) -> bytearray
 *
 * One binary column (keys or values) out of the walked records: the bytes [starts[j], ends[j])
 * of buf for j = sel[i] (i = 0 .. len(sel)-1), or for every j when sel is None, one after the
 * other in a new bytearray; offsets (int32, writable, len(sel or starts) + 1 elements) receives
 * the Arrow offsets of the column. A null field has starts[j] == ends[j] (the walk sets it so)
 * and takes no bytes; the caller adds the validity bitmap.
 *
 * Why: pyarrow's take over fast_decode's interleaved "pieces" array did this at about 47 ms per
 * million 100-byte values (two passes, bounds checks, a call per element); a plain memcpy loop
 * over the positions the walk already has is a fraction of it. Every position is checked
 * against buf before anything is copied, and a column over INT32_MAX bytes is refused (Arrow's
 * binary offsets are int32; the chunk buffer never is that large).
 */
static PyObject *gather(PyObject *self, PyObject *args)
{
    PyObject *o_buf, *o_st, *o_en, *o_sel, *o_off;
    Buf b[5];
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OOOOO", &o_buf, &o_st, &o_en, &o_sel, &o_off))
        return NULL;
    PyObject *out = NULL;
    if (get_buffer(o_buf, &b[0], 0, 0, 1, "buf") < 0 ||
        get_buffer(o_st, &b[1], 0, 0, 8, "starts") < 0)
        goto fail;
    const Py_ssize_t n = b[1].view.len / 8;
    if (get_buffer(o_en, &b[2], 0, n, 8, "ends") < 0)
        goto fail;
    Py_ssize_t m = n;
    const int64_t *sel = NULL;
    if (o_sel != Py_None) {
        if (get_buffer(o_sel, &b[3], 0, 0, 8, "sel") < 0)
            goto fail;
        m = b[3].view.len / 8;
        sel = (const int64_t *)b[3].view.buf;
    }
    if (get_buffer(o_off, &b[4], 1, m + 1, 4, "offsets") < 0)
        goto fail;
    const uint8_t *buf = (const uint8_t *)b[0].view.buf;
    const int64_t size = (int64_t)b[0].view.len;
    const int64_t *st = (const int64_t *)b[1].view.buf, *en = (const int64_t *)b[2].view.buf;
    int32_t *off = (int32_t *)b[4].view.buf;

    int64_t total = 0;
    off[0] = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        const int64_t j = sel ? sel[i] : (int64_t)i;
        if (j < 0 || j >= n) {
            PyErr_Format(PyExc_ValueError, "_recwalk.gather: sel[%zd] = %lld is not a record "
                         "of %zd", i, (long long)j, n);
            goto fail;
        }
        const int64_t s = st[j], e = en[j];
        if (s < 0 || e < s || e > size) {
            PyErr_Format(PyExc_ValueError, "_recwalk.gather: record %lld: bytes [%lld, %lld) "
                         "are not inside the %lld-byte buffer", (long long)j, (long long)s,
                         (long long)e, (long long)size);
            goto fail;
        }
        total += e - s;
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "_recwalk.gather: the column would hold more "
                            "than 2**31-1 bytes");
            goto fail;
        }
        off[i + 1] = (int32_t)total;
    }
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        goto fail;
    uint8_t *dst = (uint8_t *)PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        const int64_t j = sel ? sel[i] : (int64_t)i;
        const int64_t len = (int64_t)off[i + 1] - off[i];
        if (len)
            memcpy(dst + off[i], buf + st[j], (size_t)len);
    }
    Py_END_ALLOW_THREADS
    release(b, 5);
    return out;
fail:
    release(b, 5);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, sec_start, sec_end, counts, st, en, tsd, od, ks, ke, knull, vs, ve, vnull, ok, "
     "batch_ok): record boundaries and fields of magic-2 records sections (see the module "
     "comment in _recwalk.c)."},
    {"gather", gather, METH_VARARGS,
     "gather(buf, starts, ends, sel, offsets) -> bytearray: the bytes [starts[j], ends[j]) of "
     "buf for j in sel (or every j when sel is None), one after the other; offsets receives "
     "the Arrow int32 offsets (see _recwalk.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recwalk",
    "Record boundaries and fields of Kafka magic-2 records sections, in C (fast_decode's walk).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__recwalk(void)
{
    return PyModule_Create(&module);
}
