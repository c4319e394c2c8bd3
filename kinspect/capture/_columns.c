/* The figures of a capture batch's integer_fields column, cut out of its scans' counters in one pass
 * (kinspect.capture.columns.IntegerFieldColumns.column_numpy is the reference).
 *
 * Why C: numpy needs a dozen passes over a batch's counters (about 4,000 slots of 25 int64 for
 * 512 rows of recorded traffic) to join them, keep the present slots and trim their histograms,
 * most of them over rows of 10 buckets, where its per-row overhead dominates; here it is one loop.
 *
 * cut(counters, labels, per_row, stride, occurrences, count, fixed, uvarint, zigzag, uhist, zhist, buckets)
 *   counters: list of bytes, each scan's int64 counters (native byte order), `stride` per slot;
 *   labels: list of bytes, per scan the int32 label number of each of its slots;
 *   per_row: list or tuple of ints, how many scans each row has (they sum to len(counters));
 *   the rest: offsets of the counters in a slot (capture.columns reads them from codegen).
 * -> (row_offsets, labels, count, fixed, uvarint, zigzag, uhist_offsets, uhist_values, zhist_offsets, zhist_values),
 *   bytes of int32 or int64 (fixed, uvarint, zigzag) values: per present slot (occurrences > 0), in
 *   order, its label and figures; a histogram without its trailing zero counts; row_offsets: present
 *   slots before each row and after the last. Integers narrowed to int32 wrap as numpy's astype does. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { OUT_ROWS, OUT_LABELS, OUT_COUNT, OUT_FIXED, OUT_UVARINT, OUT_ZIGZAG, OUT_UOFF, OUT_UVAL, OUT_ZOFF, OUT_ZVAL, OUT_N };

static int64_t load64(const char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void store32(char *p, int64_t v) {
    int32_t w = (int32_t)(uint32_t)(uint64_t)v; /* two's complement wrap, as astype(np.int32) */
    memcpy(p, &w, 4);
}

static void store64(char *p, int64_t v) { memcpy(p, &v, 8); }

/* Appends one histogram of `buckets` counts at `h`, without its trailing zeros, to values at *n. */
static int32_t trim(const char *h, Py_ssize_t buckets, char *values, Py_ssize_t *n) {
    Py_ssize_t keep = buckets;
    while (keep > 0 && load64(h + 8 * (keep - 1)) == 0)
        keep--;
    for (Py_ssize_t i = 0; i < keep; i++)
        store32(values + 4 * (*n)++, load64(h + 8 * i));
    return (int32_t)keep;
}

static PyObject *cut(PyObject *self, PyObject *args) {
    PyObject *counters, *labels, *rows_seq;
    Py_ssize_t stride, at_occ, at_count, at_fixed, at_uvarint, at_zigzag, at_uhist, at_zhist, buckets;
    if (!PyArg_ParseTuple(args, "O!O!Onnnnnnnnn", &PyList_Type, &counters, &PyList_Type, &labels, &rows_seq, &stride, &at_occ, &at_count, &at_fixed, &at_uvarint, &at_zigzag, &at_uhist,
                          &at_zhist, &buckets))
        return NULL;
    Py_ssize_t offsets[] = {at_occ, at_count, at_fixed, at_uvarint, at_zigzag, at_uhist + buckets,
                            at_zhist + buckets};
    if (stride <= 0 || buckets < 0 || at_uhist < 0 || at_zhist < 0) {
        PyErr_SetString(PyExc_ValueError, "bad slot layout");
        return NULL;
    }
    for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) {
        if (offsets[i] < 0 || offsets[i] > stride || (i < 5 && offsets[i] == stride)) {
            PyErr_SetString(PyExc_ValueError, "bad slot layout");
            return NULL;
        }
    }
    PyObject *out[OUT_N] = {NULL};
    PyObject *per_row = PySequence_Fast(rows_seq, "per_row must be a list or tuple");
    if (per_row == NULL)
        return NULL;
    Py_ssize_t scans = PyList_GET_SIZE(counters), rows = PySequence_Fast_GET_SIZE(per_row);
    if (PyList_GET_SIZE(labels) != scans) {
        PyErr_Format(PyExc_ValueError, "%zd label tables for %zd scans' counters", PyList_GET_SIZE(labels), scans);
        goto fail;
    }
    Py_ssize_t slot_bytes = 8 * stride, slots = 0, per_row_total = 0;
    for (Py_ssize_t i = 0; i < scans; i++) {
        PyObject *c = PyList_GET_ITEM(counters, i), *l = PyList_GET_ITEM(labels, i);
        if (!PyBytes_Check(c) || !PyBytes_Check(l)) {
            PyErr_SetString(PyExc_TypeError, "counters and labels must be bytes");
            goto fail;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(c) / slot_bytes;
        if (PyBytes_GET_SIZE(c) % slot_bytes || PyBytes_GET_SIZE(l) != 4 * n) {
            PyErr_Format(PyExc_ValueError, "scan %zd: %zd bytes of counters for %zd bytes of labels", i,
                         PyBytes_GET_SIZE(c), PyBytes_GET_SIZE(l));
            goto fail;
        }
        slots += n;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(per_row, r));
        if (k == -1 && PyErr_Occurred())
            goto fail;
        if (k < 0 || k > scans) {
            PyErr_Format(PyExc_ValueError, "row %zd has %zd scans", r, k);
            goto fail;
        }
        per_row_total += k;
    }
    if (per_row_total != scans) {
        PyErr_Format(PyExc_ValueError, "rows have %zd scans, not %zd", per_row_total, scans);
        goto fail;
    }
    if (slots > (PY_SSIZE_T_MAX / 4 - 1) / (buckets + 2)) {
        PyErr_NoMemory();
        goto fail;
    }
    /* Sized for every slot present and every bucket kept; shrunk to what was written. */
    Py_ssize_t sizes[OUT_N] = {4 * (rows + 1), 4 * slots, 4 * slots, 8 * slots, 8 * slots, 8 * slots,
                               4 * (slots + 1), 4 * slots * buckets, 4 * (slots + 1), 4 * slots * buckets};
    char *o[OUT_N];
    for (int i = 0; i < OUT_N; i++) {
        out[i] = PyBytes_FromStringAndSize(NULL, sizes[i]);
        if (out[i] == NULL)
            goto fail;
        o[i] = PyBytes_AS_STRING(out[i]);
    }
    Py_ssize_t kept = 0, nu = 0, nz = 0, scan = 0;
    store32(o[OUT_ROWS], 0);
    store32(o[OUT_UOFF], 0);
    store32(o[OUT_ZOFF], 0);
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(per_row, r));
        for (Py_ssize_t j = 0; j < k; j++, scan++) {
            PyObject *c = PyList_GET_ITEM(counters, scan);
            const char *slot = PyBytes_AS_STRING(c), *label = PyBytes_AS_STRING(PyList_GET_ITEM(labels, scan));
            Py_ssize_t n = PyBytes_GET_SIZE(c) / slot_bytes;
            for (Py_ssize_t s = 0; s < n; s++, slot += slot_bytes, label += 4) {
                if (load64(slot + 8 * at_occ) <= 0)
                    continue; /* the field was not there (an empty array counts) */
                memcpy(o[OUT_LABELS] + 4 * kept, label, 4);
                store32(o[OUT_COUNT] + 4 * kept, load64(slot + 8 * at_count));
                store64(o[OUT_FIXED] + 8 * kept, load64(slot + 8 * at_fixed));
                store64(o[OUT_UVARINT] + 8 * kept, load64(slot + 8 * at_uvarint));
                store64(o[OUT_ZIGZAG] + 8 * kept, load64(slot + 8 * at_zigzag));
                trim(slot + 8 * at_uhist, buckets, o[OUT_UVAL], &nu);
                trim(slot + 8 * at_zhist, buckets, o[OUT_ZVAL], &nz);
                kept++;
                store32(o[OUT_UOFF] + 4 * kept, nu);
                store32(o[OUT_ZOFF] + 4 * kept, nz);
            }
        }
        store32(o[OUT_ROWS] + 4 * (r + 1), kept);
    }
    Py_ssize_t final[OUT_N] = {4 * (rows + 1), 4 * kept, 4 * kept, 8 * kept, 8 * kept, 8 * kept,
                               4 * (kept + 1), 4 * nu, 4 * (kept + 1), 4 * nz};
    for (int i = 0; i < OUT_N; i++) {
        if (final[i] != sizes[i] && _PyBytes_Resize(&out[i], final[i]) < 0)
            goto fail;
    }
    PyObject *result = PyTuple_New(OUT_N);
    if (result == NULL)
        goto fail;
    for (int i = 0; i < OUT_N; i++)
        PyTuple_SET_ITEM(result, i, out[i]);
    Py_DECREF(per_row);
    return result;
fail:
    for (int i = 0; i < OUT_N; i++)
        Py_XDECREF(out[i]);
    Py_DECREF(per_row);
    return NULL;
}

static PyMethodDef methods[] = {
    {"cut", cut, METH_VARARGS, "Cut a batch's integer_fields figures out of its scans' counters (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kinspect.capture._columns",
    "A capture batch's integer_fields figures cut out of its scans' counters in one pass (see capture.columns).", -1,
    methods};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
