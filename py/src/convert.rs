//! Conversions between serde values and Python objects.
//!
//! Reports (stats, verify, compact) and saved loader states are serde types
//! in the Rust crates; they reach Python as plain dicts, lists and numbers.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Serialises `value` and rebuilds it as Python objects.
pub fn to_py<'py, T: Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let json = serde_json::to_value(value).map_err(|e| PyValueError::new_err(format!("cannot convert report: {e}")))?;
    value_to_py(py, &json)
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, value_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// Parses a serde value from JSON text produced on the Python side.
pub fn from_json<T: DeserializeOwned>(text: &str, what: &str) -> PyResult<T> {
    serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("{what} is not valid: {e}")))
}

/// Parses an optional codec name ("raw", "zstd", "zstd_dict").
pub fn codec_name(obj: Option<&str>) -> PyResult<Option<zring_engine::Codec>> {
    match obj {
        None => Ok(None),
        Some(name) => zring_engine::Codec::from_name(name).map(Some).map_err(crate::error::engine),
    }
}
