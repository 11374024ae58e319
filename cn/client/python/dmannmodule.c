/* dmannmodule.c: the Python module `dmann`, a thin C extension over libdmann (dmann.h) with
 * NumPy arrays in and out. Errors raise ValueError (-EINVAL, -E2BIG), KeyError (-ENOENT),
 * PermissionError (-EPERM, -EACCES) or dmann.Error (anything else) carrying libdmann's
 * message (dmann_errmsg()). Calls release the GIL while libdmann works. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dmann.h"

static PyObject *DmannError;

typedef struct {
	PyObject_HEAD
	dmann_t *d;
} Conn;

static PyObject *raise_err(int rc)
{
	const char *m = dmann_errmsg();
	PyObject *type = rc == -EINVAL || rc == -E2BIG ? PyExc_ValueError :
			 rc == -ENOENT ? PyExc_KeyError :
			 rc == -EPERM || rc == -EACCES ? PyExc_PermissionError : DmannError;

	PyErr_SetString(type, m && *m ? m : strerror(-rc));
	return NULL;
}

/* A C-contiguous float32 matrix (a vector becomes 1 x n) from any array-like. */
static PyArrayObject *as_f32(PyObject *o)
{
	PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(o, NPY_FLOAT32, 1, 2,
							     NPY_ARRAY_C_CONTIGUOUS |
							     NPY_ARRAY_ALIGNED);
	return a;
}

/* keys: a list/tuple of str -> a malloc'd array of UTF-8 pointers (owned by the list). */
static const char **as_keys(PyObject *seq, Py_ssize_t *n)
{
	PyObject *f = PySequence_Fast(seq, "keys must be a sequence of str");
	const char **k;

	if (!f)
		return NULL;
	*n = PySequence_Fast_GET_SIZE(f);
	k = calloc((size_t)(*n ? *n : 1), sizeof(*k));
	for (Py_ssize_t i = 0; k && i < *n; i++) {
		PyObject *s = PySequence_Fast_GET_ITEM(f, i);

		k[i] = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
		if (!k[i]) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_TypeError, "key %zd is not a str", i);
			free(k);
			Py_DECREF(f);
			return NULL;
		}
	}
	Py_DECREF(f);   /* the strings live in seq, which the caller holds */
	return k;
}

static void conn_dealloc(Conn *c)
{
	dmann_close(c->d);
	Py_TYPE(c)->tp_free((PyObject *)c);
}

static int metric_of(const char *m)
{
	if (!m || !strcmp(m, "euclidean"))
		return DMANN_EUCLIDEAN;
	if (!strcmp(m, "cosine"))
		return DMANN_COSINE;
	return -1;
}

static PyObject *c_create_index(Conn *c, PyObject *args)
{
	const char *b, *n, *m = "euclidean";
	unsigned int dim;
	int rc, mt;

	if (!PyArg_ParseTuple(args, "ssI|s", &b, &n, &dim, &m))
		return NULL;
	mt = metric_of(m);
	if (mt < 0) {
		PyErr_Format(PyExc_ValueError, "metric must be 'euclidean' or 'cosine', not '%s'", m);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = dmann_create_index(c->d, b, n, dim, (enum dmann_metric)mt);
	Py_END_ALLOW_THREADS
	return rc ? raise_err(rc) : Py_NewRef(Py_None);
}

static PyObject *c_drop_index(Conn *c, PyObject *args)
{
	const char *b, *n;
	int rc;

	if (!PyArg_ParseTuple(args, "ss", &b, &n))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = dmann_drop_index(c->d, b, n);
	Py_END_ALLOW_THREADS
	return rc ? raise_err(rc) : Py_NewRef(Py_None);
}

static PyObject *c_describe_index(Conn *c, PyObject *args)
{
	const char *b, *n;
	uint32_t dim = 0;
	enum dmann_metric m = DMANN_EUCLIDEAN;
	int rc;

	if (!PyArg_ParseTuple(args, "ss", &b, &n))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = dmann_describe_index(c->d, b, n, &dim, &m);
	Py_END_ALLOW_THREADS
	if (rc)
		return raise_err(rc);
	return Py_BuildValue("{s:I, s:s}", "dimension", dim, "metric",
			     m == DMANN_COSINE ? "cosine" : "euclidean");
}

static PyObject *c_put(Conn *c, PyObject *args, PyObject *kw)
{
	static char *kws[] = { "bucket", "name", "keys", "vectors", "metadata", NULL };
	const char *b, *n;
	PyObject *keys, *vecs, *md = Py_None, *mdstr = NULL;
	PyArrayObject *a = NULL;
	const char **k = NULL, **mds = NULL;
	Py_ssize_t nk = 0;
	int rc = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "ssOO|O", kws, &b, &n, &keys, &vecs, &md))
		return NULL;
	k = as_keys(keys, &nk);
	if (!k)
		return NULL;
	a = as_f32(vecs);
	if (!a)
		goto out;
	if ((PyArray_NDIM(a) == 2 ? PyArray_DIM(a, 0) : 1) != nk) {
		PyErr_Format(PyExc_ValueError, "%zd keys for %zd vectors", nk,
			     PyArray_NDIM(a) == 2 ? (Py_ssize_t)PyArray_DIM(a, 0) : 1);
		goto out;
	}
	if (md != Py_None) {
		/* A list of dicts (or None): JSON texts via the json module. */
		PyObject *json = PyImport_ImportModule("json"), *dumps;
		Py_ssize_t nm;

		if (!json)
			goto out;
		dumps = PyObject_GetAttrString(json, "dumps");
		Py_DECREF(json);
		mdstr = PyList_New(0);
		nm = PySequence_Size(md);
		if (!dumps || !mdstr || nm != nk) {
			Py_XDECREF(dumps);
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_ValueError, "metadata must have one entry per key");
			goto out;
		}
		mds = calloc((size_t)(nk ? nk : 1), sizeof(*mds));
		for (Py_ssize_t i = 0; mds && i < nk; i++) {
			PyObject *e = PySequence_GetItem(md, i), *s;

			if (!e)
				break;
			if (e == Py_None) {
				Py_DECREF(e);
				continue;
			}
			s = PyObject_CallOneArg(dumps, e);
			Py_DECREF(e);
			if (!s)
				break;
			PyList_Append(mdstr, s);
			Py_DECREF(s);
			mds[i] = PyUnicode_AsUTF8(s);
		}
		Py_DECREF(dumps);
		if (PyErr_Occurred())
			goto out;
	}
	{
		const float *v = PyArray_DATA(a);

		Py_BEGIN_ALLOW_THREADS
		uint32_t dim = (uint32_t)PyArray_DIM(a, PyArray_NDIM(a) - 1);

		rc = dmann_put(c->d, b, n, (size_t)nk, k, v, dim, mds);
		Py_END_ALLOW_THREADS
	}
	if (rc)
		raise_err(rc);
out:
	free(k);
	free(mds);
	Py_XDECREF(mdstr);
	Py_XDECREF(a);
	if (PyErr_Occurred())
		return NULL;
	return Py_NewRef(Py_None);
}

/* Arguments (bucket, name, keys) -> the keys as UTF-8 pointers (free them), or NULL. */
static const char **bucket_name_keys(PyObject *args, const char **b, const char **n,
				     Py_ssize_t *nk)
{
	PyObject *keys;

	if (!PyArg_ParseTuple(args, "ssO", b, n, &keys))
		return NULL;
	return as_keys(keys, nk);
}

static PyObject *c_delete(Conn *c, PyObject *args)
{
	const char *b, *n;
	const char **k;
	Py_ssize_t nk;
	int rc;

	k = bucket_name_keys(args, &b, &n, &nk);
	if (!k)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = dmann_delete(c->d, b, n, (size_t)nk, k);
	Py_END_ALLOW_THREADS
	free(k);
	return rc ? raise_err(rc) : Py_NewRef(Py_None);
}

/* get -> (float32 matrix nk x dim, bool array found). */
static PyObject *c_get(Conn *c, PyObject *args)
{
	const char *b, *n;
	PyObject *out = NULL, *found = NULL;
	const char **k;
	Py_ssize_t nk;
	uint32_t dim = 0;
	int rc;

	k = bucket_name_keys(args, &b, &n, &nk);
	if (!k)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = dmann_describe_index(c->d, b, n, &dim, NULL);
	Py_END_ALLOW_THREADS
	if (!rc) {
		npy_intp sh[2] = { nk, dim };

		out = PyArray_SimpleNew(2, sh, NPY_FLOAT32);
		found = PyArray_SimpleNew(1, sh, NPY_BOOL);
		if (out && found) {
			float *o = PyArray_DATA((PyArrayObject *)out);
			uint8_t *f = PyArray_DATA((PyArrayObject *)found);

			Py_BEGIN_ALLOW_THREADS
			rc = dmann_get(c->d, b, n, (size_t)nk, k, o, dim, f);
			Py_END_ALLOW_THREADS
			rc = rc < 0 ? rc : 0;
		}
	}
	free(k);
	if (rc || !out || !found) {
		Py_XDECREF(out);
		Py_XDECREF(found);
		return rc ? raise_err(rc) : NULL;
	}
	return Py_BuildValue("(NN)", out, found);
}

/* batch_query -> (keys: list of lists of str, distances: float32 nq x k with +inf pad). */
static PyObject *c_batch_query(Conn *c, PyObject *args)
{
	const char *b, *n;
	PyObject *vecs, *klist = NULL, *dist = NULL;
	PyArrayObject *a;
	unsigned int k;
	char **keys = NULL;
	uint32_t *cnt = NULL;
	size_t nq;
	int rc = -ENOMEM;

	if (!PyArg_ParseTuple(args, "ssOI", &b, &n, &vecs, &k))
		return NULL;
	a = as_f32(vecs);
	if (!a)
		return NULL;
	nq = PyArray_NDIM(a) == 2 ? (size_t)PyArray_DIM(a, 0) : 1;
	if (k == 0 || k > DMANN_MAX_K) {
		Py_DECREF(a);
		PyErr_Format(PyExc_ValueError, "k = %u is outside 1..%u", k, DMANN_MAX_K);
		return NULL;
	}
	npy_intp sh[2] = { (npy_intp)nq, k };

	dist = PyArray_SimpleNew(2, sh, NPY_FLOAT32);
	keys = calloc(nq * k + 1, sizeof(*keys));
	cnt = calloc(nq + 1, sizeof(*cnt));
	if (dist && keys && cnt) {
		const float *v = PyArray_DATA(a);
		float *dd = PyArray_DATA((PyArrayObject *)dist);

		Py_BEGIN_ALLOW_THREADS
		uint32_t dim = (uint32_t)PyArray_DIM(a, PyArray_NDIM(a) - 1);

		rc = dmann_batch_query(c->d, b, n, v, nq, dim, k, keys, dd, cnt);
		Py_END_ALLOW_THREADS
	}
	Py_DECREF(a);
	if (!rc) {
		klist = PyList_New((Py_ssize_t)nq);
		for (size_t i = 0; klist && i < nq; i++) {
			PyObject *row = PyList_New(cnt[i]);

			for (uint32_t j = 0; row && j < cnt[i]; j++)
				PyList_SET_ITEM(row, j, PyUnicode_FromString(keys[i * k + j]));
			PyList_SET_ITEM(klist, (Py_ssize_t)i, row);
		}
	}
	dmann_free_keys(keys, nq * k);
	free(keys);
	free(cnt);
	if (rc) {
		Py_XDECREF(dist);
		return rc == -ENOMEM && !PyErr_Occurred() ? PyErr_NoMemory() : raise_err(rc);
	}
	return Py_BuildValue("(NN)", klist, dist);
}

/* search(matrix, k, ef=64, beam=1, inflight=0, routing="client", graph=0) over one of the
 * cluster's HNSW graphs -> (uint64 ids nq x k, padded with 2**64-1; float32 distances
 * nq x k, +inf pad). */
static PyObject *c_search(Conn *c, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "vectors", "k", "ef", "beam", "inflight", "routing", "graph",
			       NULL };
	struct dmann_search_params p = { .ef = 64 };
	const char *routing = "client";
	PyObject *vecs, *ids = NULL, *dist = NULL;
	PyArrayObject *a;
	size_t nq;
	uint32_t dim;
	int rc = -ENOMEM;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OI|IIIsI", kwl, &vecs, &p.k, &p.ef, &p.beam,
					 &p.inflight, &routing, &p.graph))
		return NULL;
	if (p.graph >= 16) {
		PyErr_Format(PyExc_ValueError, "graph = %u is outside 0..15", p.graph);
		return NULL;
	}
	if (strcmp(routing, "client") && strcmp(routing, "server")) {
		PyErr_Format(PyExc_ValueError, "routing '%s': must be 'client' or 'server'", routing);
		return NULL;
	}
	p.routing = routing[0] == 'c' ? DMANN_ROUTE_CLIENT : DMANN_ROUTE_SERVER;
	if (p.k == 0 || p.k > 1024) {
		PyErr_Format(PyExc_ValueError, "k = %u is outside 1..1024", p.k);
		return NULL;
	}
	a = as_f32(vecs);
	if (!a)
		return NULL;
	nq = PyArray_NDIM(a) == 2 ? (size_t)PyArray_DIM(a, 0) : 1;
	dim = (uint32_t)PyArray_DIM(a, PyArray_NDIM(a) - 1);
	npy_intp sh[2] = { (npy_intp)nq, p.k };

	ids = PyArray_SimpleNew(2, sh, NPY_UINT64);
	dist = PyArray_SimpleNew(2, sh, NPY_FLOAT32);
	if (ids && dist) {
		const float *v = PyArray_DATA(a);
		uint64_t *io = PyArray_DATA((PyArrayObject *)ids);
		float *dd = PyArray_DATA((PyArrayObject *)dist);

		Py_BEGIN_ALLOW_THREADS
		rc = dmann_search(c->d, v, nq, dim, &p, io, dd, NULL, NULL);
		Py_END_ALLOW_THREADS
	}
	Py_DECREF(a);
	if (rc) {
		Py_XDECREF(ids);
		Py_XDECREF(dist);
		return rc == -ENOMEM && !PyErr_Occurred() ? PyErr_NoMemory() : raise_err(rc);
	}
	return Py_BuildValue("(NN)", ids, dist);
}

/* query -> (keys list, distances float32 array) for one vector. */
static PyObject *c_query(Conn *c, PyObject *args)
{
	PyObject *r = c_batch_query(c, args), *keys, *dist, *out;

	if (!r)
		return NULL;
	keys = PyList_GetItem(PyTuple_GetItem(r, 0), 0);
	dist = PyTuple_GetItem(r, 1);
	PyObject *row = PySequence_GetItem(dist, 0);

	if (!row) {
		Py_DECREF(r);
		return NULL;
	}
	PyObject *trimmed = PySequence_GetSlice(row, 0, PyList_Size(keys));

	out = Py_BuildValue("(ON)", keys, trimmed);
	Py_DECREF(row);
	Py_DECREF(r);
	return out;
}

static PyObject *c_close(Conn *c, PyObject *unused)
{
	(void)unused;
	dmann_close(c->d);
	c->d = NULL;
	return Py_NewRef(Py_None);
}

static PyMethodDef conn_methods[] = {
	{ "create_index", (PyCFunction)c_create_index, METH_VARARGS,
	  "create_index(bucket, name, dim, metric='euclidean'): create an index (and its bucket)" },
	{ "describe_index", (PyCFunction)c_describe_index, METH_VARARGS,
	  "describe_index(bucket, name) -> {'dimension': d, 'metric': m}" },
	{ "drop_index", (PyCFunction)c_drop_index, METH_VARARGS,
	  "drop_index(bucket, name): delete the index and its vectors" },
	{ "put", (PyCFunction)(void (*)(void))c_put, METH_VARARGS | METH_KEYWORDS,
	  "put(bucket, name, keys, vectors, metadata=None): float32 matrix, one key per row" },
	{ "get", (PyCFunction)c_get, METH_VARARGS,
	  "get(bucket, name, keys) -> (float32 matrix, found bool array)" },
	{ "delete", (PyCFunction)c_delete, METH_VARARGS, "delete(bucket, name, keys)" },
	{ "query", (PyCFunction)c_query, METH_VARARGS,
	  "query(bucket, name, vector, k) -> (keys, float32 distances)" },
	{ "batch_query", (PyCFunction)c_batch_query, METH_VARARGS,
	  "batch_query(bucket, name, matrix, k) -> (list of key lists, float32 nq x k distances)" },
	{ "search", (PyCFunction)(void (*)(void))c_search, METH_VARARGS | METH_KEYWORDS,
	  "search(matrix, k, ef=64, beam=1, inflight=0, routing='client', graph=0) -> (uint64 "
	  "ids nq x k, float32 nq x k distances) over HNSW graph `graph` (dmann load --graph)" },
	{ "close", (PyCFunction)c_close, METH_NOARGS, "close the connections" },
	{ NULL, NULL, 0, NULL },
};

static PyTypeObject ConnType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dmann.Connection",
	.tp_basicsize = sizeof(Conn),
	.tp_dealloc = (destructor)conn_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A libdmann connection to a cluster's compute nodes (dmann.connect)",
	.tp_methods = conn_methods,
};

static PyObject *m_connect(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kws[] = { "config", "client", NULL };
	const char *cfg, *client = NULL;
	Conn *c;
	dmann_t *d;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|z", kws, &cfg, &client))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	d = dmann_connect(cfg, client);
	Py_END_ALLOW_THREADS
	if (!d)
		return raise_err(-errno);
	c = PyObject_New(Conn, &ConnType);
	if (!c) {
		dmann_close(d);
		return NULL;
	}
	c->d = d;
	return (PyObject *)c;
}

static PyMethodDef module_methods[] = {
	{ "connect", (PyCFunction)(void (*)(void))m_connect, METH_VARARGS | METH_KEYWORDS,
	  "connect(config, client=None) -> Connection: a cluster file and a client identity" },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "dmann",
	"dmann: the Python binding of libdmann (S3 Vectors indexes of a dmann cluster)", -1,
	module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_dmann(void)
{
	PyObject *m;

	import_array();
	if (PyType_Ready(&ConnType) < 0)
		return NULL;
	m = PyModule_Create(&module);
	if (!m)
		return NULL;
	DmannError = PyErr_NewException("dmann.Error", NULL, NULL);
	PyModule_AddObject(m, "Error", DmannError);
	PyModule_AddStringConstant(m, "__version__", DMANN_VERSION);
	return m;
}
