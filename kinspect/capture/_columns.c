/* The figures of a capture batch's integer_fields column, cut out of its scans' counters in one pass
 * (kinspect.capture.columns.IntegerFieldColumns.column_numpy is the reference); and integers() and micros(),
 * the Arrow buffers of a batch's integer and time columns (capture.batch._integers' and _times' numpy paths
 * are the references).
 *
 * Why C: numpy needs a dozen passes over a batch's counters (about 4,000 slots of 25 int32 for
 * 512 rows of recorded traffic) to join them, keep the present slots and trim their histograms,
 * most of them over rows of 10 buckets, where its per-row overhead dominates; here it is one loop.
 *
 * cut(counters, labels, per_row, stride, occurrences, count, fixed, uvarint, zigzag, uhist, zhist, buckets)
 *   counters: list of bytes, each scan's int32 counters (native byte order, codegen.COUNTER_TYPECODE),
 *   `stride` per slot;
 *   labels: list of bytes, per scan the int32 label number of each of its slots;
 *   per_row: list or tuple of ints, how many scans each row has (they sum to len(counters));
 *   the rest: offsets of the counters in a slot (capture.columns reads them from codegen).
 * -> (row_offsets, labels, count, fixed, uvarint, zigzag, uhist_offsets, uhist_values, zhist_offsets, zhist_values),
 *   bytes of int32 or int64 (fixed, uvarint, zigzag) values: per present slot (occurrences > 0), in
 *   order, its label and figures; a histogram without its trailing zero counts; row_offsets: present
 *   slots before each row and after the last. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

enum { OUT_ROWS, OUT_LABELS, OUT_COUNT, OUT_FIXED, OUT_UVARINT, OUT_ZIGZAG, OUT_UOFF, OUT_UVAL, OUT_ZOFF, OUT_ZVAL, OUT_N };

static int64_t load32(const char *p) { /* a counter */
    int32_t v;
    memcpy(&v, p, 4);
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
    while (keep > 0 && load32(h + 4 * (keep - 1)) == 0)
        keep--;
    for (Py_ssize_t i = 0; i < keep; i++)
        store32(values + 4 * (*n)++, load32(h + 4 * i));
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
    Py_ssize_t slot_bytes = 4 * stride, slots = 0, per_row_total = 0;
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
                if (load32(slot + 4 * at_occ) <= 0)
                    continue; /* the field was not there (an empty array counts) */
                memcpy(o[OUT_LABELS] + 4 * kept, label, 4);
                store32(o[OUT_COUNT] + 4 * kept, load32(slot + 4 * at_count));
                store64(o[OUT_FIXED] + 8 * kept, load32(slot + 4 * at_fixed));
                store64(o[OUT_UVARINT] + 8 * kept, load32(slot + 4 * at_uvarint));
                store64(o[OUT_ZIGZAG] + 8 * kept, load32(slot + 4 * at_zigzag));
                trim(slot + 4 * at_uhist, buckets, o[OUT_UVAL], &nu);
                trim(slot + 4 * at_zhist, buckets, o[OUT_ZVAL], &nz);
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

/* A fixed-width column's Arrow buffers from a list or tuple of values and Nones: (data, validity, null count),
 * data the values as `width`-byte little-endian ints (0 where None), validity Arrow's bitmap (bit i set where
 * values[i] is not None, the bits past the last value cleared as Arrow clears them; None when nothing is
 * null). convert(item, context, &value) gives each value: 1 made, 0 declined (then the whole column is:
 * None is returned, for numpy's path to decide), -1 an error. */
typedef int (*convert_fn)(PyObject *item, const void *context, int64_t *value);

static PyObject *fixed_width(PyObject *seq, int width, convert_fn convert, const void *context) {
#if PY_BIG_ENDIAN
    Py_RETURN_NONE; /* Arrow's buffers are little-endian: numpy's path converts */
#endif
    PyObject *fast = PySequence_Fast(seq, "values must be a list or tuple");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), nulls = 0;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * width), *validity = NULL, *result = NULL;
    if (data == NULL)
        goto done;
    char *out = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = 0;
        if (items[i] == Py_None) {
            if (validity == NULL) { /* the first null: every value before it was valid */
                if ((validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8)) == NULL)
                    goto done;
                memset(PyBytes_AS_STRING(validity), 0xff, (n + 7) / 8);
            }
            PyBytes_AS_STRING(validity)[i / 8] &= (char)~(1u << (i % 8));
            nulls++;
        } else {
            int made = convert(items[i], context, &v);
            if (made <= 0) {
                if (made == 0)
                    result = Py_NewRef(Py_None);
                goto done;
            }
        }
        switch (width) {
        case 1: { int8_t w = (int8_t)v; memcpy(out + i, &w, 1); break; }
        case 2: { int16_t w = (int16_t)v; memcpy(out + 2 * i, &w, 2); break; }
        case 4: { int32_t w = (int32_t)v; memcpy(out + 4 * i, &w, 4); break; }
        default: memcpy(out + 8 * i, &v, 8); break;
        }
    }
    if (n % 8 && validity != NULL)
        PyBytes_AS_STRING(validity)[n / 8] &= (char)((1u << (n % 8)) - 1);
    result = Py_BuildValue("(OOn)", data, validity != NULL ? validity : Py_None, nulls);
done:
    Py_DECREF(fast);
    Py_XDECREF(data);
    Py_XDECREF(validity);
    return result;
}

/* An exact int within [bounds[0], bounds[1]]. */
static int int_in_range(PyObject *item, const void *context, int64_t *value) {
    const long long *bounds = context;
    int overflow = 0;
    if (!PyLong_CheckExact(item))
        return 0;
    long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < bounds[0] || v > bounds[1])
        return 0;
    *value = v;
    return 1;
}

/* rint((seconds + offset) * 1e6) of an exact, finite float: a sum and a product, each rounded to float64 as
 * numpy's are, then half to even as np.rint (the default rounding mode). */
static int microseconds(PyObject *item, const void *context, int64_t *value) {
    if (!PyFloat_CheckExact(item))
        return 0;
    double rounded = nearbyint((PyFloat_AS_DOUBLE(item) + *(const double *)context) * 1000000.0);
    if (!isfinite(rounded) || rounded < -9.2e18 || rounded > 9.2e18)
        return 0;
    *value = (int64_t)rounded;
    return 1;
}

/* integers(values, width): an integer column's Arrow buffers (fixed_width), or None where numpy must decide.
 *
 * values: ints and Nones; width: 1, 2, 4 or 8 bytes. None when a value is not an exact int, or does not
 * fit: numpy's conversion then raises or converts as before (capture.batch._integers).
 *
 * Why: np.array on a tuple of Python ints cost about 90 ns a value, and a column with a null in it was
 * converted twice (numpy raised, pa.array started again); the capture's writer process converts 18
 * such columns a row. */
static PyObject *integers(PyObject *self, PyObject *args) {
    PyObject *seq;
    int width;
    if (!PyArg_ParseTuple(args, "Oi", &seq, &width))
        return NULL;
    if (width != 1 && width != 2 && width != 4 && width != 8) {
        PyErr_SetString(PyExc_ValueError, "integers: width must be 1, 2, 4 or 8");
        return NULL;
    }
    long long bounds[2] = {width == 8 ? LLONG_MIN : -(1LL << (8 * width - 1)),
                           width == 8 ? LLONG_MAX : (1LL << (8 * width - 1)) - 1};
    return fixed_width(seq, width, int_in_range, bounds);
}

/* micros(values, offset): a time column's Arrow buffers in int64 microseconds (fixed_width), or None where
 * numpy must decide: values are floats (seconds) and Nones, as capture.batch._times' numpy path converts
 * them; None when a value is not an exact float, not finite, or its microseconds do not fit an int64. */
static PyObject *micros(PyObject *self, PyObject *args) {
    PyObject *seq;
    double offset;
    if (!PyArg_ParseTuple(args, "Od", &seq, &offset))
        return NULL;
    return fixed_width(seq, 8, microseconds, &offset);
}

static PyMethodDef methods[] = {
    {"cut", cut, METH_VARARGS, "Cut a batch's integer_fields figures out of its scans' counters (see the module)."},
    {"integers", integers, METH_VARARGS, "An integer column's Arrow buffers (see integers' comment)."},
    {"micros", micros, METH_VARARGS, "A time column's Arrow buffers, in microseconds (see micros' comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kinspect.capture._columns",
    "A capture batch's integer_fields figures cut out of its scans' counters in one pass (see capture.columns), "
    "and its integer columns' Arrow buffers (see capture.batch).", -1,
    methods};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
