//! External data of an ONNX model (a tensor with `data_location = EXTERNAL`, its bytes
//! at `offset`, `length` in the file `location` names), read here and never by tract,
//! which is given no directory: tract fails the whole model on a missing file, and a
//! model must not make the importer read outside its directory. Every external tensor
//! but a weight is read, bounds-checked and inlined; where data is unavailable, the
//! importer goes on from the graph alone (see the parent module) and, when a shape then
//! cannot be inferred, blames the missing data rather than the symptom.

use super::{OnnxError, attr, is_float, is_weight, node_name, standard, tensor_type};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use tract_onnx::pb::{
    self,
    tensor_proto::{DataLocation, DataType},
};

/// An external tensor whose data could not be read.
pub(super) struct Unavailable {
    /// An initializer's name, or the output of the `Constant` node holding it.
    tensor: String,
    /// That `Constant` node's index, for an attribute's tensor.
    node: Option<usize>,
    float: bool,
    /// The data file as the user would look for it.
    file: String,
    /// Why it is unavailable, following "whose external data FILE".
    why: String,
}

impl Unavailable {
    /// Whether this is the top-level initializer `name` (a typed input in its place).
    pub(super) fn is_initializer(&self, name: &str) -> bool {
        self.node.is_none() && self.tensor == name
    }
}

fn is_external(t: &pb::TensorProto) -> bool {
    t.data_location == Some(DataLocation::External as i32)
}

/// Bytes per element of a type with a raw (little-endian, fixed-size) form.
fn element_bytes(data_type: i32) -> Option<u64> {
    Some(match DataType::from_i32(data_type)? {
        DataType::Bool | DataType::Int8 | DataType::Uint8 => 1,
        DataType::Int16 | DataType::Uint16 | DataType::Float16 | DataType::Bfloat16 => 2,
        DataType::Int32 | DataType::Uint32 | DataType::Float => 4,
        DataType::Int64 | DataType::Uint64 | DataType::Double | DataType::Complex64 => 8,
        DataType::Complex128 => 16,
        DataType::Undefined | DataType::String => return None,
    })
}

/// The `location`, `offset` and `length` of `t`'s external data (`name` in messages).
fn external_entry<'t>(
    t: &'t pb::TensorProto,
    name: &str,
) -> Result<(&'t str, u64, Option<u64>), OnnxError> {
    let value = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let location = value("location").ok_or_else(|| {
        OnnxError::Malformed(format!(
            "tensor '{name}' is stored as external data but names no location"
        ))
    })?;
    let number = |key: &str| {
        value(key)
            .map(|v| {
                v.trim().parse::<u64>().map_err(|_| {
                    OnnxError::Malformed(format!(
                        "tensor '{name}' has external data {key} '{v}', not a byte count"
                    ))
                })
            })
            .transpose()
    };
    Ok((location, number("offset")?.unwrap_or(0), number("length")?))
}

/// An external location must name a file inside the model's directory, as ONNX requires:
/// a model file must not make the importer read elsewhere.
fn check_location(name: &str, location: &str) -> Result<(), OnnxError> {
    use std::path::Component;
    let path = Path::new(location);
    let reason = if location.is_empty() {
        "is empty"
    } else if path.has_root() {
        "is an absolute path"
    } else if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        "leaves the model's directory"
    } else {
        return Ok(());
    };
    Err(OnnxError::ExternalPath {
        tensor: name.to_string(),
        location: printable(location),
        reason,
    })
}

/// A location as written, escaped only if it would break the error's line.
fn printable(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.escape_debug().to_string()
    } else {
        s.to_string()
    }
}

/// A data file: its resolved path and length, or why it cannot be read.
type DataFile = Result<(PathBuf, u64), String>;

/// The external data files beside the model, each looked up once. tract is never given
/// the directory: its own lookup fails the whole model on a missing file.
pub(super) struct ExternalFiles<'d> {
    /// The model's directory; None for a model given as bytes.
    dir: Option<&'d Path>,
    files: HashMap<String, DataFile>,
}

impl<'d> ExternalFiles<'d> {
    pub(super) fn new(dir: Option<&'d Path>) -> Self {
        ExternalFiles {
            dir,
            files: HashMap::new(),
        }
    }

    fn display(&self, location: &str) -> String {
        match self.dir {
            Some(dir) => printable(&dir.join(location).display().to_string()),
            None => printable(location),
        }
    }

    /// The file at `location` (checked by [`check_location`]); an error where a link
    /// takes it out of the model's directory.
    fn file(&mut self, name: &str, location: &str) -> Result<DataFile, OnnxError> {
        if let Some(found) = self.files.get(location) {
            return Ok(found.clone());
        }
        let found = self.look_up(name, location)?;
        self.files.insert(location.to_string(), found.clone());
        Ok(found)
    }

    fn look_up(&self, name: &str, location: &str) -> Result<DataFile, OnnxError> {
        let Some(dir) = self.dir else {
            return Ok(Err(
                "cannot be found: the model was not read from a file".to_string()
            ));
        };
        let unreadable = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::NotFound {
                "is missing".to_string()
            } else {
                format!("cannot be read ({e})")
            }
        };
        let (root, path) = match (dir.canonicalize(), dir.join(location).canonicalize()) {
            (Ok(root), Ok(path)) => (root, path),
            (Err(e), _) | (_, Err(e)) => return Ok(Err(unreadable(e))),
        };
        if !path.starts_with(&root) {
            return Err(OnnxError::ExternalPath {
                tensor: name.to_string(),
                location: printable(location),
                reason: "leads outside the model's directory through a link",
            });
        }
        // A FIFO would block the read, a device never end it: a regular file only.
        Ok(match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok((path, meta.len())),
            Ok(_) => Err("is not a regular file".to_string()),
            Err(e) => Err(unreadable(e)),
        })
    }
}

/// Replaces the external reference of `t` (`name` in messages) by its bytes as raw data,
/// or returns the data file and why it cannot be read. A malformed reference or one
/// leaving the model's directory is an error, whether or not the file is there.
fn inline_external(
    t: &mut pb::TensorProto,
    name: &str,
    files: &mut ExternalFiles,
) -> Result<Option<(String, String)>, OnnxError> {
    use std::io::{Read, Seek, SeekFrom};
    let (location, offset, length) = external_entry(t, name)?;
    check_location(name, location)?;
    let malformed = |what: String| Err(OnnxError::Malformed(format!("tensor '{name}' {what}")));
    let Some(size) = element_bytes(t.data_type) else {
        return malformed(format!(
            "is stored as external data, which element type {} cannot be",
            t.data_type
        ));
    };
    let need = t.dims.iter().try_fold(size, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    let Some(need) = need else {
        return malformed(format!("has dimensions {:?}, no tensor's", t.dims));
    };
    if let Some(length) = length
        && length != need
    {
        return malformed(format!(
            "has {length} bytes of external data, but its dimensions {:?} take {need}",
            t.dims
        ));
    }
    let file = files.display(location);
    let (path, file_len) = match files.file(name, location)? {
        Ok(found) => found,
        Err(why) => return Ok(Some((file, why))),
    };
    let end = offset.saturating_add(need);
    if end > file_len {
        let why = format!("is {file_len} bytes, short of its bytes {offset}..{end}");
        return Ok(Some((file, why)));
    }
    let mut bytes = Vec::new();
    let read = std::fs::File::open(&path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        // Bounded by the file's length, checked above.
        bytes.reserve_exact(need as usize);
        f.take(need).read_to_end(&mut bytes)
    });
    match read {
        Ok(n) if n as u64 == need => {}
        Ok(n) => {
            let why = format!("ended after {n} of its bytes {offset}..{end}");
            return Ok(Some((file, why)));
        }
        Err(e) => return Ok(Some((file, format!("cannot be read ({e})")))),
    }
    t.raw_data = bytes;
    t.data_location = None;
    t.external_data.clear();
    Ok(None)
}

/// Inlines the external data of every tensor but a top-level weight (a typed input,
/// never read), attributes and subgraphs included, so that tract never sees an external
/// tensor and never opens a file. `within` is None at the top level, where an
/// initializer or a `Constant` node's value whose data is unavailable joins `missing` to
/// stand in as a typed input; a subgraph's inputs are its operator's to bind, so there,
/// and in any other attribute, unavailable data is an error.
pub(super) fn resolve_external(
    graph: &mut pb::GraphProto,
    files: &mut ExternalFiles,
    within: Option<&str>,
    missing: &mut Vec<Unavailable>,
) -> Result<(), OnnxError> {
    let needed = |place: &str, tensor: &str, (file, why): (String, String)| {
        Err(OnnxError::ExternalNeeded {
            place: place.to_string(),
            tensor: tensor.to_string(),
            file,
            why,
        })
    };
    for t in graph.initializer.iter_mut().filter(|t| is_external(t)) {
        let name = t.name.clone();
        if within.is_none() && is_weight(t) {
            // Never read, but a model naming a file outside its directory is refused.
            check_location(&name, external_entry(t, &name)?.0)?;
            continue;
        }
        if let Some(unavailable) = inline_external(t, &name, files)? {
            match within {
                Some(place) => return needed(place, &name, unavailable),
                None => missing.push(Unavailable {
                    tensor: name,
                    node: None,
                    float: is_float(t.data_type),
                    file: unavailable.0,
                    why: unavailable.1,
                }),
            }
        }
    }
    for (i, node) in graph.node.iter_mut().enumerate() {
        let place = format!("{} node '{}'", node.op_type, node_name(node));
        let constant_output = (within.is_none() && standard(node) && node.op_type == "Constant")
            .then(|| node.output.first().filter(|o| !o.is_empty()).cloned())
            .flatten();
        // A nested subgraph is named by the top-level node that holds it.
        let sub_place = within.map_or_else(|| format!("a subgraph of {place}"), str::to_string);
        for attr in &mut node.attribute {
            let stands_in = constant_output.as_ref().filter(|_| attr.name == "value");
            for t in attr.t.iter_mut().chain(&mut attr.tensors) {
                if !is_external(t) {
                    continue;
                }
                let name = match stands_in {
                    Some(out) => out.clone(),
                    None if t.name.is_empty() => attr.name.clone(),
                    None => t.name.clone(),
                };
                let Some(unavailable) = inline_external(t, &name, files)? else {
                    continue;
                };
                match (stands_in, within) {
                    (Some(_), _) => missing.push(Unavailable {
                        tensor: name,
                        node: Some(i),
                        float: is_float(t.data_type),
                        file: unavailable.0,
                        why: unavailable.1,
                    }),
                    (None, Some(outer)) => return needed(outer, &name, unavailable),
                    (None, None) => return needed(&place, &name, unavailable),
                }
            }
            for g in attr.g.iter_mut().chain(&mut attr.graphs) {
                resolve_external(g, files, Some(&sub_place), missing)?;
            }
        }
    }
    Ok(())
}

/// Takes the `Constant` nodes whose value is unavailable out of the graph tract sees,
/// each output a typed input instead (the node has its shape and type); returns them
/// with their indices, last first, for [`restore_constants`].
pub(super) fn lift_constants(
    graph: &mut pb::GraphProto,
    missing: &[Unavailable],
) -> Vec<(usize, pb::NodeProto)> {
    let mut at: Vec<usize> = missing.iter().filter_map(|m| m.node).collect();
    at.sort_unstable();
    at.dedup();
    let lifted: Vec<(usize, pb::NodeProto)> = at
        .into_iter()
        .rev()
        .map(|i| (i, graph.node.remove(i)))
        .collect();
    for (_, node) in &lifted {
        let value = attr(node, "value").and_then(|a| a.t.as_ref());
        if let (Some(out), Some(t)) = (node.output.first(), value) {
            // Dimensions checked non-negative when its data was looked for.
            let dims: Vec<u64> = t.dims.iter().map(|&d| d as u64).collect();
            graph.input.push(pb::ValueInfoProto {
                name: out.clone(),
                r#type: Some(tensor_type(&dims, t.data_type)),
                ..Default::default()
            });
        }
    }
    lifted
}

/// Puts lifted `Constant` nodes back in place of their stand-in inputs: extraction sees
/// the graph as the model has it (a constant bias, the nodes it lists).
pub(super) fn restore_constants(graph: &mut pb::GraphProto, lifted: Vec<(usize, pb::NodeProto)>) {
    graph.input.retain(|i| {
        !lifted
            .iter()
            .any(|(_, n)| n.output.first() == Some(&i.name))
    });
    for (i, node) in lifted.into_iter().rev() {
        graph.node.insert(i, node);
    }
}

/// A shape tract could not infer, or a graph it could not read, where data is missing:
/// the error names the missing data, the real cause, rather than the symptom. A shape is
/// blamed on the nearest unavailable tensor it is computed from, if any.
pub(super) fn blame_missing(
    e: OnnxError,
    graph: &pb::GraphProto,
    missing: &[Unavailable],
) -> OnnxError {
    if missing.is_empty() {
        return e;
    }
    let reader = |n: &pb::NodeProto| format!("read by {} node '{}'", n.op_type, node_name(n));
    let (needed, found, read_by) = match &e {
        OnnxError::Shape {
            node,
            op,
            tensor,
            role,
            ..
        } => {
            let producers: HashMap<&str, &pb::NodeProto> = graph
                .node
                .iter()
                .flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n)))
                .collect();
            let mut queue = std::collections::VecDeque::from([(
                tensor.as_str(),
                format!("read by {op} node '{node}'"),
            )]);
            let mut seen: HashSet<&str> = HashSet::from([tensor.as_str()]);
            let mut found = None;
            while let Some((t, read_by)) = queue.pop_front() {
                if let Some(m) = missing.iter().find(|m| m.tensor == t) {
                    found = Some((m, read_by));
                    break;
                }
                if let Some(&p) = producers.get(t) {
                    for input in p.input.iter().filter(|i| !i.is_empty()) {
                        if seen.insert(input.as_str()) {
                            queue.push_back((input.as_str(), reader(p)));
                        }
                    }
                }
            }
            let Some((m, read_by)) = found else {
                return e;
            };
            (
                format!("cannot infer the shape of '{tensor}' ({role} of {op} node '{node}')"),
                m,
                read_by,
            )
        }
        OnnxError::Tract(_) => {
            // Shapes are computed from integers more often than from floats.
            let Some(m) = missing
                .iter()
                .find(|m| !m.float)
                .or_else(|| missing.first())
            else {
                return e;
            };
            let read_by = graph
                .node
                .iter()
                .find(|n| n.input.contains(&m.tensor))
                .map_or_else(|| "read by no node".to_string(), reader);
            ("tract cannot read the model".to_string(), m, read_by)
        }
        _ => return e,
    };
    OnnxError::ExternalMissing {
        needed,
        tensor: found.tensor.clone(),
        reader: read_by,
        file: found.file.clone(),
        why: found.why.clone(),
    }
}
