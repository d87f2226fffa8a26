//! The response patch: an RFC 6902 diff of the typed pod before and after the chain.
//!
//! Both sides are serialisations of the same typed `Pod`, so a field our `k8s-openapi` does not
//! know is absent from both and never appears in the patch: the API server keeps it. Arrays need
//! more care than a positional diff gives them. A positional diff turns "prepend an init
//! container" into a `replace` of every field of every element, and the API server applies those
//! replaces to its *raw* JSON, where each element may still carry fields we cannot see; they would
//! end up attached to the wrong container. So arrays are aligned first (by `name` where elements
//! have one, by equality otherwise) and only the real insertions and deletions become `add` and
//! `remove`; an element that survived is diffed in place.

use std::mem::swap;

use json_patch::jsonptr::{PointerBuf, Token};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::{Map, Value};

/// Above this many cells the middle of two arrays is not aligned with an LCS table (bounded
/// memory and time for hostile input such as 10,000 containers); unmatched elements are then
/// paired by position when the counts agree, or removed and added otherwise.
const MAX_ALIGN_CELLS: usize = 40_000;

/// An RFC 6902 patch, held as the JSON array it is sent as. Each operation is written when the
/// diff finds it, its value serialised once, straight from the typed element (a fetcher init
/// container, an env var) or the JSON section it came from: no `serde_json::Value` per added
/// element, and nothing to serialise again when the reply is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    json: Vec<u8>,
    len: usize,
}

impl Patch {
    /// The number of operations.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The patch as a JSON array of operations (`[]` when empty).
    pub fn as_json(&self) -> &[u8] {
        &self.json
    }
}

/// The writer of a [`Patch`]: operations in the field order `json_patch` serialises them in
/// (`op`, `path`, `value`), the path a JSON string of the escaped pointer `ptr`, which the diff
/// moves down and up the documents as it goes.
struct Ops {
    json: Vec<u8>,
    len: usize,
    ptr: PointerBuf,
}

type Written = Result<(), serde_json::Error>;

impl Ops {
    fn new() -> Self {
        let mut json = Vec::with_capacity(1024);
        json.push(b'[');
        Self {
            json,
            len: 0,
            ptr: PointerBuf::root(),
        }
    }

    /// `f` with `token` pushed on the pointer, popped again whatever `f` returns.
    fn at<'t>(
        &mut self,
        token: impl Into<Token<'t>>,
        f: impl FnOnce(&mut Self) -> Written,
    ) -> Written {
        self.ptr.push_back(token);
        let written = f(self);
        self.ptr.pop_back();
        written
    }

    fn start(&mut self, op: &str) -> Written {
        if self.len > 0 {
            self.json.push(b',');
        }
        self.len += 1;
        self.json.extend_from_slice(b"{\"op\":\"");
        self.json.extend_from_slice(op.as_bytes());
        self.json.extend_from_slice(b"\",\"path\":");
        serde_json::to_writer(&mut self.json, self.ptr.as_str())
    }

    fn with_value<T: Serialize + ?Sized>(&mut self, op: &str, value: &T) -> Written {
        self.start(op)?;
        self.json.extend_from_slice(b",\"value\":");
        serde_json::to_writer(&mut self.json, value)?;
        self.json.push(b'}');
        Ok(())
    }

    fn add<T: Serialize + ?Sized>(&mut self, value: &T) -> Written {
        self.with_value("add", value)
    }

    fn remove(&mut self) -> Written {
        self.start("remove")?;
        self.json.push(b'}');
        Ok(())
    }

    fn finish(mut self) -> Patch {
        self.json.push(b']');
        Patch {
            json: self.json,
            len: self.len,
        }
    }

    /// The typed pod always has `metadata`, the JSON it came from may not: an empty one is
    /// replaced whole (`add` on an existing member replaces it), so the patch applies either way.
    fn pods(&mut self, before: &mut Pod, after: &mut Pod) -> Written {
        if before.metadata != after.metadata {
            if before.metadata == ObjectMeta::default() {
                self.section("metadata", None, Some(&after.metadata))?;
            } else {
                self.at("metadata", |o| {
                    o.metadata(&mut before.metadata, &mut after.metadata)
                })?;
            }
        }
        match (before.spec.as_mut(), after.spec.as_mut()) {
            (Some(a), Some(b)) => self.at("spec", |o| o.spec(a, b))?,
            (a, b) => self.section("spec", a.as_deref(), b.as_deref())?,
        }
        self.section("status", before.status.as_ref(), after.status.as_ref())
    }

    /// Metadata that changed: its labels and annotations (what mutators add to) are diffed as
    /// maps of their own, the rest (which may hold a long `managedFields`) only when it changed.
    fn metadata(&mut self, a: &mut ObjectMeta, b: &mut ObjectMeta) -> Written {
        let labels = (a.labels.take(), b.labels.take());
        let annotations = (a.annotations.take(), b.annotations.take());
        let rest = self.whole(&*a, &*b);
        (a.labels, b.labels) = labels;
        (a.annotations, b.annotations) = annotations;
        rest?;
        self.section("labels", a.labels.as_ref(), b.labels.as_ref())?;
        self.section(
            "annotations",
            a.annotations.as_ref(),
            b.annotations.as_ref(),
        )
    }

    fn spec(&mut self, a: &mut PodSpec, b: &mut PodSpec) -> Written {
        let (mut la, mut lb) = (SpecLists::default(), SpecLists::default());
        la.swap(a);
        lb.swap(b);
        let diffed = self.spec_parts(a, b, &mut la, &mut lb);
        la.swap(a);
        lb.swap(b);
        diffed
    }

    /// The spec's lists, each element on its own, and the rest of the spec (`containers: []`
    /// on each side) and its DNS config between them, in about the order the whole-document
    /// diff gives (no operation depends on another's order: they touch different members).
    fn spec_parts(
        &mut self,
        a: &PodSpec,
        b: &PodSpec,
        la: &mut SpecLists,
        lb: &mut SpecLists,
    ) -> Written {
        let (ca, cb) = (Some(&mut la.containers), Some(&mut lb.containers));
        self.list("containers", ca, cb, |c| &c.name, Self::container)?;
        self.whole(a, b)?;
        self.section("dnsConfig", la.dns_config.as_ref(), lb.dns_config.as_ref())?;
        let (ia, ib) = (la.init_containers.as_mut(), lb.init_containers.as_mut());
        self.list("initContainers", ia, ib, |c| &c.name, Self::container)?;
        let (va, vb) = (la.volumes.as_mut(), lb.volumes.as_mut());
        self.list("volumes", va, vb, |v| &v.name, |o, a, b| o.whole(&*a, &*b))
    }

    /// A container edited in place: its env and mounts (what mutators add to) are diffed as
    /// lists of their own, its image (what the image mutators rewrite) as a field of its own,
    /// the rest only when it changed.
    fn container(&mut self, a: &mut Container, b: &mut Container) -> Written {
        let env = (a.env.take(), b.env.take());
        let mounts = (a.volume_mounts.take(), b.volume_mounts.take());
        let image = (a.image.take(), b.image.take());
        let rest = self.whole(&*a, &*b);
        (a.env, b.env) = env;
        (a.volume_mounts, b.volume_mounts) = mounts;
        (a.image, b.image) = image;
        rest?;
        self.section("image", a.image.as_ref(), b.image.as_ref())?;
        self.grown("env", a.env.as_deref(), b.env.as_deref(), |e| &e.name)?;
        let (ma, mb) = (a.volume_mounts.as_deref(), b.volume_mounts.as_deref());
        self.grown("volumeMounts", ma, mb, |m| &m.name)
    }

    /// A list of named elements that mutators grow: env vars go in front, mounts at the end.
    /// When `b` is `a` with elements added only at the end, or only in front (and the first
    /// added one is not named as `a`'s first), the operations are the `add`s of the new
    /// elements, written without serialising `a` or aligning the lists: exactly what
    /// [`diff_value`] gives for the two lists (its aligner keeps all of `a` as a common prefix,
    /// or as a common suffix when the first elements are not the same item, and inserts the
    /// rest). Any other change goes to [`Ops::section`]. A 10,000-container pod has 20,000
    /// such lists.
    fn grown<T: Serialize + PartialEq>(
        &mut self,
        key: &str,
        a: Option<&[T]>,
        b: Option<&[T]>,
        name: fn(&T) -> &str,
    ) -> Written {
        if let (Some(a), Some(b)) = (a, b)
            && b.len() > a.len()
        {
            let added = b.len() - a.len();
            if b[..a.len()] == *a {
                return self.adds(key, &b[a.len()..], a.len());
            }
            if b[added..] == *a && a.first().is_none_or(|first| name(first) != name(&b[0])) {
                return self.adds(key, &b[..added], 0);
            }
        }
        self.section(key, a, b)
    }

    /// `add` of each of `added` at `ptr/key/<at + i>`.
    fn adds<T: Serialize>(&mut self, key: &str, added: &[T], at: usize) -> Written {
        self.at(key, |o| {
            added
                .iter()
                .enumerate()
                .try_for_each(|(i, element)| o.at(at + i, |o| o.add(element)))
        })
    }

    /// `a` and `b` serialised and diffed at `ptr`, unless they are equal.
    fn whole<T: Serialize + PartialEq + ?Sized>(&mut self, a: &T, b: &T) -> Written {
        if a != b {
            self.serialised(a, b)?;
        }
        Ok(())
    }

    fn serialised<T: Serialize + ?Sized>(&mut self, a: &T, b: &T) -> Written {
        diff_value(&serde_json::to_value(a)?, &serde_json::to_value(b)?, self)
    }

    /// A named list. When both sides have the same names in the same order (a mutator edited
    /// elements in place), each changed element is diffed on its own by `diff_elem`. When `b`
    /// is `a`'s names with elements added only at the end, or only in front (the first added
    /// one not named as `a`'s first), the operations are the `add`s of the new elements and
    /// the in-place diffs of the old ones at their new indices, in the order [`diff_value`]'s
    /// aligner gives them (it keeps `a` as a common prefix, or as a common suffix, and inserts
    /// the rest): fetcher init containers go in front, their volumes at the end. Anything else
    /// is aligned whole.
    fn list<T: Serialize + PartialEq>(
        &mut self,
        key: &str,
        a: Option<&mut Vec<T>>,
        b: Option<&mut Vec<T>>,
        name: fn(&T) -> &str,
        diff_elem: DiffElem<T>,
    ) -> Written {
        let same_names = |x: &[T], y: &[T]| x.iter().zip(y).all(|(p, q)| name(p) == name(q));
        match (a, b) {
            (Some(a), Some(b)) if a.len() == b.len() && same_names(a, b) => {
                self.in_place(key, a, b, 0, diff_elem)
            }
            (Some(a), Some(b)) if b.len() > a.len() && same_names(a, &b[..a.len()]) => {
                let (kept, added) = b.split_at_mut(a.len());
                self.in_place(key, a, kept, 0, diff_elem)?;
                self.adds(key, added, a.len())
            }
            (Some(a), Some(b))
                if b.len() > a.len()
                    && same_names(a, &b[b.len() - a.len()..])
                    && a.first().is_none_or(|first| name(first) != name(&b[0])) =>
            {
                let at = b.len() - a.len();
                let (added, kept) = b.split_at_mut(at);
                self.adds(key, added, 0)?;
                self.in_place(key, a, kept, added.len(), diff_elem)
            }
            (a, b) => self.section(key, a.as_deref(), b.as_deref()),
        }
    }

    /// `diff_elem` of each pair that differs, `b[i]` at `ptr/key/<at + i>`.
    fn in_place<T: PartialEq>(
        &mut self,
        key: &str,
        a: &mut [T],
        b: &mut [T],
        at: usize,
        diff_elem: DiffElem<T>,
    ) -> Written {
        self.at(key, |o| {
            let pairs = a.iter_mut().zip(b.iter_mut()).enumerate();
            pairs
                .filter(|(_, (x, y))| x != y)
                .try_for_each(|(i, (x, y))| o.at(at + i, |o| diff_elem(o, x, y)))
        })
    }

    fn section<T: Serialize + PartialEq + ?Sized>(
        &mut self,
        key: &str,
        before: Option<&T>,
        after: Option<&T>,
    ) -> Written {
        if before == after {
            return Ok(());
        }
        self.at(key, |o| match (before, after) {
            (Some(a), Some(b)) => o.serialised(a, b),
            (None, Some(b)) => o.add(b),
            (Some(_), None) => o.remove(),
            (None, None) => Ok(()),
        })
    }
}

/// The patch from `before` to `after`, computed section by section: only the sections that
/// differ (typed comparison, no serialisation) are serialised and diffed. `status`, and
/// `metadata` when only the spec changed, are never turned into JSON at all. In the spec, the
/// lists mutators edit (containers, init containers, volumes) are compared element by element,
/// so a pod whose one container gained an env var serialises that container, not the pod.
/// The pods are taken apart while they are diffed (so that the rest of a spec or container
/// compares without its lists).
pub fn diff_pods(mut before: Pod, mut after: Pod) -> Result<Patch, serde_json::Error> {
    let mut ops = Ops::new();
    ops.pods(&mut before, &mut after)?;
    Ok(ops.finish())
}

/// The parts of a spec that mutators edit (the mesh's DNS options besides the lists), taken
/// out so that the rest of it compares alone.
#[derive(Default)]
struct SpecLists {
    containers: Vec<Container>,
    init_containers: Option<Vec<Container>>,
    volumes: Option<Vec<k8s_openapi::api::core::v1::Volume>>,
    dns_config: Option<k8s_openapi::api::core::v1::PodDNSConfig>,
}

impl SpecLists {
    /// Trades these parts for the spec's: taken out into empty ones, and put back.
    fn swap(&mut self, spec: &mut PodSpec) {
        swap(&mut self.containers, &mut spec.containers);
        swap(&mut self.init_containers, &mut spec.init_containers);
        swap(&mut self.volumes, &mut spec.volumes);
        swap(&mut self.dns_config, &mut spec.dns_config);
    }
}

/// The signature of an element differ of [`Ops::list`].
type DiffElem<T> = fn(&mut Ops, &mut T, &mut T) -> Written;

fn diff_value(a: &Value, b: &Value, ops: &mut Ops) -> Written {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => diff_object(a, b, ops),
        (Value::Array(a), Value::Array(b)) => diff_array(a, b, ops),
        _ if a == b => Ok(()),
        _ => ops.with_value("replace", b),
    }
}

fn diff_object(a: &Map<String, Value>, b: &Map<String, Value>, ops: &mut Ops) -> Written {
    for key in a.keys().filter(|k| !b.contains_key(*k)) {
        ops.at(key.as_str(), Ops::remove)?;
    }
    b.iter().try_for_each(|(key, bv)| {
        ops.at(key.as_str(), |o| match a.get(key) {
            Some(av) => diff_value(av, bv, o),
            None => o.add(bv),
        })
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Keep(usize, usize),
    Del(usize),
    Ins(usize),
}

fn diff_array(a: &[Value], b: &[Value], ops: &mut Ops) -> Written {
    if a == b {
        return Ok(());
    }
    let mut k = 0usize;
    for step in align(a, b) {
        ops.at(k, |o| match step {
            Step::Keep(i, j) => {
                k += 1;
                diff_value(&a[i], &b[j], o)
            }
            Step::Del(_) => o.remove(),
            Step::Ins(j) => {
                k += 1;
                o.add(&b[j])
            }
        })?;
    }
    Ok(())
}

/// How well two elements match: 2 when equal, 1 when both are objects with the same string
/// `name` (containers, env vars, volumes, mounts, DNS options, ...), 0 otherwise. Equal
/// elements win over same-name ones, so a replaced variable moves rather than its neighbours.
fn affinity(x: &Value, y: &Value) -> u32 {
    if x == y {
        return 2;
    }
    fn name(v: &Value) -> Option<&str> {
        v.get("name")?.as_str()
    }
    u32::from(name(x).is_some_and(|p| name(y) == Some(p)))
}

fn same_item(x: &Value, y: &Value) -> bool {
    affinity(x, y) > 0
}

fn align(a: &[Value], b: &[Value]) -> Vec<Step> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| same_item(x, y)).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| same_item(x, y))
        .count();
    let (mid_a, mid_b) = (prefix..a.len() - suffix, prefix..b.len() - suffix);

    let mut steps: Vec<Step> = (0..prefix).map(|i| Step::Keep(i, i)).collect();
    let middle = lcs_steps(&a[mid_a.clone()], &b[mid_b.clone()]);
    steps.extend(pair_equal_gaps(middle).into_iter().map(|s| match s {
        Step::Keep(i, j) => Step::Keep(i + mid_a.start, j + mid_b.start),
        Step::Del(i) => Step::Del(i + mid_a.start),
        Step::Ins(j) => Step::Ins(j + mid_b.start),
    }));
    steps.extend((0..suffix).map(|t| Step::Keep(mid_a.end + t, mid_b.end + t)));
    steps
}

/// Heaviest common subsequence under [`affinity`], as steps; all-delete-then-insert when the
/// table would be too large.
fn lcs_steps(a: &[Value], b: &[Value]) -> Vec<Step> {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 || n.saturating_mul(m) > MAX_ALIGN_CELLS {
        return (0..n).map(Step::Del).chain((0..m).map(Step::Ins)).collect();
    }
    let w = m + 1;
    let weight: Vec<u32> = (0..n * m).map(|c| affinity(&a[c / m], &b[c % m])).collect();
    // table[i][j] = best total weight of a[i..] against b[j..]
    let mut table = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            let skip = table[(i + 1) * w + j].max(table[i * w + j + 1]);
            let wt = weight[i * m + j];
            table[i * w + j] = if wt > 0 {
                skip.max(wt + table[(i + 1) * w + j + 1])
            } else {
                skip
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut steps = Vec::with_capacity(n + m);
    while i < n && j < m {
        let wt = weight[i * m + j];
        if wt > 0 && table[i * w + j] == wt + table[(i + 1) * w + j + 1] {
            steps.push(Step::Keep(i, j));
            i += 1;
            j += 1;
        } else if table[(i + 1) * w + j] >= table[i * w + j + 1] {
            steps.push(Step::Del(i));
            i += 1;
        } else {
            steps.push(Step::Ins(j));
            j += 1;
        }
    }
    steps.extend((i..n).map(Step::Del));
    steps.extend((j..m).map(Step::Ins));
    steps
}

/// Between two kept anchors, a run of as many deletions as insertions is an in-place change
/// (an unnamed element that was edited); pair them so the element is diffed, not replaced.
fn pair_equal_gaps(steps: Vec<Step>) -> Vec<Step> {
    let mut out = Vec::with_capacity(steps.len());
    let mut dels = Vec::new();
    let mut ins = Vec::new();
    let flush = |out: &mut Vec<Step>, dels: &mut Vec<usize>, ins: &mut Vec<usize>| {
        if dels.len() == ins.len() {
            out.extend(dels.iter().zip(ins.iter()).map(|(&i, &j)| Step::Keep(i, j)));
        } else {
            out.extend(dels.iter().map(|&i| Step::Del(i)));
            out.extend(ins.iter().map(|&j| Step::Ins(j)));
        }
        dels.clear();
        ins.clear();
    };
    for step in steps {
        match step {
            Step::Del(i) => dels.push(i),
            Step::Ins(j) => ins.push(j),
            keep @ Step::Keep(..) => {
                flush(&mut out, &mut dels, &mut ins);
                out.push(keep);
            }
        }
    }
    flush(&mut out, &mut dels, &mut ins);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use json_patch::{Patch, PatchOperation};
    use proptest::prelude::*;
    use rstest::rstest;
    use serde_json::json;

    /// Operations that turn `before` into `after`, valid when applied in order.
    pub(crate) fn diff_values(
        before: &Value,
        after: &Value,
    ) -> Result<super::Patch, serde_json::Error> {
        let mut ops = Ops::new();
        diff_value(before, after, &mut ops)?;
        Ok(ops.finish())
    }

    /// The written operations, parsed back, after checking that they are written exactly as
    /// `json_patch` writes them and that the count is theirs.
    fn parsed(p: super::Patch) -> Patch {
        let ops: Patch = serde_json::from_slice(p.as_json()).expect("the patch is a JSON Patch");
        assert_eq!(ops.0.len(), p.len());
        assert_eq!(
            String::from_utf8_lossy(&serde_json::to_vec(&ops).unwrap()),
            String::from_utf8_lossy(p.as_json())
        );
        ops
    }

    fn diff(a: &Value, b: &Value) -> Patch {
        parsed(diff_values(a, b).unwrap())
    }

    fn diff_pods(a: Pod, b: Pod) -> Result<Patch, serde_json::Error> {
        super::diff_pods(a, b).map(parsed)
    }

    fn ops_of(p: &Patch) -> Vec<String> {
        p.0.iter()
            .map(|op| match op {
                PatchOperation::Add(o) => format!("add {}", o.path),
                PatchOperation::Remove(o) => format!("remove {}", o.path),
                PatchOperation::Replace(o) => format!("replace {}", o.path),
                other => format!("{other}"),
            })
            .collect()
    }

    #[rstest]
    #[case::prepend_is_one_add(
        json!({"c": [{"name": "a", "x": 1}, {"name": "b"}]}),
        json!({"c": [{"name": "new"}, {"name": "a", "x": 1}, {"name": "b"}]}),
        vec!["add /c/0"]
    )]
    #[case::append_is_one_add(
        json!({"c": [{"name": "a"}]}),
        json!({"c": [{"name": "a"}, {"name": "z"}]}),
        vec!["add /c/1"]
    )]
    #[case::insert_in_the_middle(
        json!({"c": [1, 2, 4]}),
        json!({"c": [1, 2, 3, 4]}),
        vec!["add /c/2"]
    )]
    #[case::named_element_edited_in_place(
        json!({"c": [{"name": "a", "env": []}, {"name": "b"}]}),
        json!({"c": [{"name": "a", "env": [{"name": "E"}]}, {"name": "b"}]}),
        vec!["add /c/0/env/0"]
    )]
    #[case::prepend_and_edit_every_element(
        json!({"c": [{"name": "a"}, {"name": "b"}]}),
        json!({"c": [{"name": "g"}, {"name": "a", "m": 1}, {"name": "b", "m": 1}]}),
        vec!["add /c/0", "add /c/1/m", "add /c/2/m"]
    )]
    #[case::unnamed_element_edited_in_place(
        json!({"o": [{"k": "ndots", "v": "5"}, {"k": "edns0"}]}),
        json!({"o": [{"k": "ndots", "v": "2"}, {"k": "edns0"}]}),
        vec!["replace /o/0/v"]
    )]
    #[case::same_name_replaced_moves_to_front(
        json!({"env": [{"name": "A"}, {"name": "X", "value": "user"}, {"name": "B"}]}),
        json!({"env": [{"name": "X", "value": "ours"}, {"name": "A"}, {"name": "B"}]}),
        vec!["add /env/0", "remove /env/2"]
    )]
    #[case::slashes_in_keys_are_escaped(
        json!({"annotations": {}}),
        json!({"annotations": {"flyte.secrets/s0": "v"}}),
        vec!["add /annotations/flyte.secrets~1s0"]
    )]
    #[case::tildes_in_keys_are_escaped(
        json!({"annotations": {}}),
        json!({"annotations": {"a~b": "w"}}),
        vec!["add /annotations/a~0b"]
    )]
    #[case::equal_documents_give_no_ops(json!({"a": [1, {"b": 2}]}), json!({"a": [1, {"b": 2}]}), vec![])]
    fn diff_emits_minimal_ops(#[case] a: Value, #[case] b: Value, #[case] expected: Vec<&str>) {
        let p = diff(&a, &b);
        assert_eq!(ops_of(&p), expected);
        let mut doc = a.clone();
        json_patch::patch(&mut doc, &p).expect("patch applies");
        assert_eq!(doc, b);
    }

    #[test]
    fn unknown_fields_in_the_raw_document_stay_with_their_element() {
        // `before` is what our typed model sees; `raw` is what the API server holds.
        let before = json!({"c": [{"name": "a"}, {"name": "b"}]});
        let raw = json!({"c": [{"name": "a", "future": 1}, {"name": "b", "future": 2}]});
        let after = json!({"c": [{"name": "gate"}, {"name": "a"}, {"name": "b"}]});
        let mut doc = raw.clone();
        json_patch::patch(&mut doc, &diff(&before, &after)).unwrap();
        assert_eq!(
            doc,
            json!({"c": [{"name": "gate"}, {"name": "a", "future": 1}, {"name": "b", "future": 2}]})
        );
    }

    #[test]
    fn huge_arrays_are_bounded_and_still_correct() {
        let a = Value::Array(
            (0..2000)
                .map(|i| json!({"name": format!("c{i}")}))
                .collect(),
        );
        let b = Value::Array(
            (0..2000)
                .rev()
                .map(|i| json!({"name": format!("c{i}")}))
                .collect(),
        );
        let mut doc = a.clone();
        json_patch::patch(&mut doc, &diff(&a, &b)).unwrap();
        assert_eq!(doc, b);
    }

    fn arb_env() -> impl Strategy<Value = Vec<k8s_openapi::api::core::v1::EnvVar>> {
        prop::collection::vec(
            ("[ABC]", proptest::option::of("[xy]")).prop_map(|(name, value)| {
                k8s_openapi::api::core::v1::EnvVar {
                    name,
                    value,
                    value_from: None,
                }
            }),
            0..5,
        )
    }

    proptest! {
        #[test]
        fn a_grown_list_gives_the_aligned_diff(
            a in arb_env(),
            added in arb_env(),
            front in any::<bool>(),
            other in arb_env(),
        ) {
            let grown = if front {
                [&added[..], &a[..]].concat()
            } else {
                [&a[..], &added[..]].concat()
            };
            for b in [grown, other] {
                let (mut fast, mut aligned) = (Ops::new(), Ops::new());
                fast.ptr.push_back("c");
                aligned.ptr.push_back("c");
                fast.grown("env", Some(&a[..]), Some(&b[..]), |e| &e.name).unwrap();
                aligned.section("env", Some(&a[..]), Some(&b[..])).unwrap();
                let (fast, aligned) = (parsed(fast.finish()), parsed(aligned.finish()));
                prop_assert_eq!(&fast, &aligned);
                let mut doc = json!({"c": {"env": a}});
                json_patch::patch(&mut doc, &fast).unwrap();
                prop_assert_eq!(doc, json!({"c": {"env": b}}));
            }
        }
    }

    fn arb_containers(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Container>> {
        prop::collection::vec(
            ("[abc]", proptest::option::of("[xy]"), arb_env()).prop_map(|(name, image, env)| {
                Container {
                    name,
                    image,
                    env: (!env.is_empty()).then_some(env),
                    ..Default::default()
                }
            }),
            len,
        )
    }

    proptest! {
        /// Containers (names may repeat) grown in front or at the end, the kept ones edited or
        /// not: the list path gives the aligner's operations, and they apply in its order.
        #[test]
        fn a_grown_container_list_gives_the_aligned_diff(
            a in arb_containers(0..4),
            added in arb_containers(0..3),
            edits in arb_containers(4..5),
            edited in prop::collection::vec(any::<bool>(), 4),
            front in any::<bool>(),
            other in arb_containers(0..4),
        ) {
            let kept: Vec<Container> = a
                .iter()
                .zip(edits.iter().zip(&edited))
                .map(|(x, (e, &on))| if on { Container { name: x.name.clone(), ..e.clone() } } else { x.clone() })
                .collect();
            let grown = if front {
                [&added[..], &kept[..]].concat()
            } else {
                [&kept[..], &added[..]].concat()
            };
            for b in [grown, kept, other] {
                let (mut fast, mut aligned) = (Ops::new(), Ops::new());
                fast.ptr.push_back("spec");
                aligned.ptr.push_back("spec");
                let (mut a2, mut b2) = (a.clone(), b.clone());
                fast.list("initContainers", Some(&mut a2), Some(&mut b2), |c| &c.name, Ops::container)
                    .unwrap();
                prop_assert_eq!((&a2, &b2), (&a, &b), "the lists are put back");
                aligned.section("initContainers", Some(&a[..]), Some(&b[..])).unwrap();
                let (fast, aligned) = (parsed(fast.finish()), parsed(aligned.finish()));
                // The same operations; within one container they may come in another order
                // (its lists and image after the rest), which no operation depends on.
                let sorted = |ops: &[PatchOperation]| {
                    let mut ops: Vec<String> = ops.iter().map(|op| json!(op).to_string()).collect();
                    ops.sort();
                    ops
                };
                prop_assert_eq!(sorted(&fast), sorted(&aligned));
                let mut doc = json!({"spec": {"initContainers": a}});
                json_patch::patch(&mut doc, &fast).unwrap();
                prop_assert_eq!(doc, json!({"spec": {"initContainers": b}}));
            }
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0i64..5).prop_map(Value::from),
            "[ab]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("(name|[a-c~/])", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn the_sectioned_pod_diff_equals_the_whole_document_diff() {
        use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
        let before = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "a".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        };
        let mut after = before.clone();
        after.metadata.labels = Some([("k".to_owned(), "v".to_owned())].into());
        after.spec.as_mut().unwrap().containers[0].image = Some("busybox".into());
        let whole = diff(
            &serde_json::to_value(&before).unwrap(),
            &serde_json::to_value(&after).unwrap(),
        );
        assert_eq!(diff_pods(before.clone(), after.clone()).unwrap(), whole);
        let mut no_spec = before.clone();
        no_spec.spec = None;
        let mut doc = serde_json::to_value(&no_spec).unwrap();
        json_patch::patch(
            &mut doc,
            &diff_pods(no_spec.clone(), after.clone()).unwrap(),
        )
        .unwrap();
        assert_eq!(doc, serde_json::to_value(&after).unwrap());
        assert!(
            diff_pods(before.clone(), before.clone())
                .unwrap()
                .0
                .is_empty()
        );
    }

    /// Every way a mutator edits a pod, at once: lists edited in place (same names in the same
    /// order), grown in front (an init container put first) and at the end, images rewritten
    /// and removed, DNS options, labels, annotations and other metadata give the same
    /// operations as diffing the whole documents.
    #[test]
    fn list_edits_give_the_whole_document_diffs_operations() {
        use k8s_openapi::api::core::v1::{EnvVar, PodDNSConfig, PodSpec, Volume};
        let container = |name: &str| Container {
            name: name.into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let volume = |name: &str| Volume {
            name: name.into(),
            ..Default::default()
        };
        let before = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some([("app".to_owned(), "x".to_owned())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container("a"), container("b"), container("c")],
                init_containers: Some(vec![container("i")]),
                volumes: Some(vec![volume("v")]),
                node_name: Some("n".into()),
                ..Default::default()
            }),
            status: None,
        };
        let mut after = before.clone();
        let spec = after.spec.as_mut().unwrap();
        for c in [0, 2] {
            spec.containers[c].env = Some(vec![EnvVar {
                name: "E".into(),
                value: Some("1".into()),
                ..Default::default()
            }]);
        }
        spec.init_containers
            .as_mut()
            .unwrap()
            .insert(0, container("gate"));
        spec.volumes.as_mut().unwrap().push(volume("w"));
        spec.dns_config = Some(PodDNSConfig::default());
        spec.containers[1].image = Some("registry.local/busybox".into());
        spec.init_containers.as_mut().unwrap()[1].image = None;
        let meta = &mut after.metadata;
        meta.labels
            .as_mut()
            .unwrap()
            .insert("mesh".into(), "on".into());
        meta.annotations = Some([("a".to_owned(), "1".to_owned())].into());
        meta.generate_name = Some("p-".into());
        let (a, b) = (
            serde_json::to_value(&before).unwrap(),
            serde_json::to_value(&after).unwrap(),
        );
        let sorted = |p: Patch| {
            let mut ops: Vec<String> = p.0.iter().map(|op| json!(op).to_string()).collect();
            ops.sort();
            ops
        };
        let patch = diff_pods(before.clone(), after.clone()).unwrap();
        assert_eq!(sorted(patch.clone()), sorted(diff(&a, &b)));
        let mut doc = a.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc, b);
        assert!(diff_pods(after.clone(), after).unwrap().0.is_empty());
    }

    #[test]
    fn a_pod_sent_without_metadata_gets_metadata_added_whole() {
        let before = Pod::default();
        let mut after = before.clone();
        after.metadata.labels = Some([("k".to_owned(), "v".to_owned())].into());
        let patch = diff_pods(before.clone(), after.clone()).unwrap();
        for original in [json!({}), json!({"metadata": {}})] {
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &patch).unwrap();
            assert_eq!(
                doc,
                json!({"metadata": {"labels": {"k": "v"}}}),
                "from {original}"
            );
        }
        assert!(
            diff_pods(before.clone(), before.clone())
                .unwrap()
                .0
                .is_empty()
        );
    }

    // -----------------------------------------------------------------------------------------
    // `b` made from `a` by edits: the patch touches only what the edits changed.

    /// A pod-like document whose lists are named (containers with env vars, volumes), plus a
    /// label map and unnamed string arrays (args), as mutators see them.
    fn arb_doc() -> impl Strategy<Value = Value> {
        let env = prop::collection::btree_map("[A-E]", "[xy]{0,2}", 0..4).prop_map(|m| {
            Value::Array(
                m.into_iter()
                    .map(|(n, v)| json!({"name": n, "value": v}))
                    .collect(),
            )
        });
        let container = (
            "[a-c]{0,1}",
            prop::option::of(env),
            prop::option::of(prop::collection::vec("[pq]", 0..3)),
        );
        let containers = prop::collection::vec(container, 0..5).prop_map(|cs| {
            Value::Array(
                cs.into_iter()
                    .enumerate()
                    .map(|(i, (image, env, args))| {
                        let mut c = json!({"name": format!("c{i}"), "image": image});
                        if let Some(env) = env {
                            c["env"] = env;
                        }
                        if let Some(args) = args {
                            c["args"] = json!(args);
                        }
                        c
                    })
                    .collect(),
            )
        });
        let volumes = prop::collection::vec(0u8..3, 0..4).prop_map(|vs| {
            Value::Array(
                vs.into_iter()
                    .enumerate()
                    .map(|(i, size)| json!({"name": format!("v{i}"), "size": size}))
                    .collect(),
            )
        });
        let labels = prop::collection::btree_map("[k-m]", "[st]", 0..3);
        (containers, volumes, labels)
            .prop_map(|(c, v, l)| json!({"containers": c, "volumes": v, "labels": l}))
    }

    /// One edit; the numbers pick the list, element, position and field at apply time.
    #[derive(Debug, Clone)]
    enum Edit {
        Insert {
            list: u8,
            at: usize,
            fresh: u8,
        },
        Delete {
            list: u8,
            at: usize,
        },
        Modify {
            list: u8,
            at: usize,
            how: u8,
            pick: usize,
        },
        Label {
            key: u8,
            value: Option<u8>,
        },
    }

    fn arb_edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0u8..2, any::<usize>(), 0u8..4).prop_map(|(list, at, fresh)| Edit::Insert {
                list,
                at,
                fresh
            }),
            (0u8..2, any::<usize>()).prop_map(|(list, at)| Edit::Delete { list, at }),
            (0u8..2, any::<usize>(), 0u8..7, any::<usize>()).prop_map(|(list, at, how, pick)| {
                Edit::Modify {
                    list,
                    at,
                    how,
                    pick,
                }
            }),
            (0u8..4, prop::option::of(0u8..2)).prop_map(|(key, value)| Edit::Label { key, value }),
        ]
    }

    /// Applies `edits` to a copy of `a`; returns `b` and the changed places as name paths
    /// (`["containers", "c1", "env", "B"]`: list elements by name, array items of unnamed
    /// arrays by `#index`).
    fn apply_edits(a: &Value, edits: &[Edit]) -> (Value, Vec<Vec<String>>) {
        let mut b = a.clone();
        let mut changed = Vec::new();
        let lists = ["containers", "volumes"];
        for edit in edits {
            match *edit {
                Edit::Insert { list, at, fresh } => {
                    let key = lists[list as usize];
                    let items = b[key].as_array_mut().unwrap();
                    let name = format!("{}-new{fresh}", &key[..1]);
                    if items.iter().any(|x| x["name"] == name.as_str()) {
                        continue;
                    }
                    let item = if key == "containers" {
                        json!({"name": name, "image": "n", "env": [{"name": "NEW", "value": "1"}]})
                    } else {
                        json!({"name": name, "size": 9})
                    };
                    items.insert(at % (items.len() + 1), item);
                    changed.push(vec![key.to_owned(), name]);
                }
                Edit::Delete { list, at } => {
                    let key = lists[list as usize];
                    let items = b[key].as_array_mut().unwrap();
                    if items.is_empty() {
                        continue;
                    }
                    let gone = items.remove(at % items.len());
                    changed.push(vec![key.to_owned(), gone["name"].as_str().unwrap().into()]);
                }
                Edit::Modify {
                    list,
                    at,
                    how,
                    pick,
                } => {
                    let key = lists[list as usize];
                    let items = b[key].as_array_mut().unwrap();
                    if items.is_empty() {
                        continue;
                    }
                    let i = at % items.len();
                    let item = &mut items[i];
                    let mut path = vec![key.to_owned(), item["name"].as_str().unwrap().to_owned()];
                    let obj = item.as_object_mut().unwrap();
                    if key == "volumes" {
                        obj.insert("size".into(), json!(100 + how as usize + pick % 7));
                        path.push("size".into());
                        changed.push(path);
                        continue;
                    }
                    match how {
                        0 => {
                            obj.insert("image".into(), json!(format!("img{}", pick % 5)));
                            path.push("image".into());
                        }
                        1 => {
                            obj.remove("env");
                            path.push("env".into());
                        }
                        2 => {
                            obj.remove("args");
                            obj.insert("args".into(), json!(["r", "s"]));
                            path.push("args".into());
                        }
                        _ => {
                            // An env var added, removed or given a new value.
                            path.push("env".into());
                            // A container without env gets the whole list added.
                            let had_env = obj.contains_key("env");
                            let env = obj.entry("env").or_insert_with(|| json!([]));
                            let env = env.as_array_mut().unwrap();
                            let var = format!("V{}", pick % 3);
                            match (how, env.is_empty()) {
                                (3, _) | (_, true) => {
                                    if env.iter().any(|e| e["name"] == var.as_str()) {
                                        continue;
                                    }
                                    env.insert(
                                        pick % (env.len() + 1),
                                        json!({"name": var, "value": "v"}),
                                    );
                                    if had_env {
                                        path.push(var);
                                    }
                                }
                                (4, false) => {
                                    let gone = env.remove(pick % env.len());
                                    path.push(gone["name"].as_str().unwrap().into());
                                }
                                _ => {
                                    let i = pick % env.len();
                                    env[i]["value"] = json!(format!("changed{how}"));
                                    path.push(env[i]["name"].as_str().unwrap().into());
                                }
                            }
                        }
                    }
                    changed.push(path);
                }
                Edit::Label { key, value } => {
                    let k = format!("l{key}");
                    let labels = b["labels"].as_object_mut().unwrap();
                    match value {
                        Some(v) => {
                            labels.insert(k.clone(), json!(format!("w{v}")));
                        }
                        None => {
                            labels.remove(&k);
                        }
                    }
                    changed.push(vec!["labels".into(), k]);
                }
            }
        }
        (b, changed)
    }

    /// The name path of `pointer` in `doc` (the document the operation applies to), and for an
    /// `add` into an array, the name of the element it inserts.
    fn name_path(doc: &Value, pointer: &str, added: Option<&Value>) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = Some(doc);
        let tokens: Vec<String> = pointer
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        for (depth, token) in tokens.iter().enumerate() {
            let last = depth + 1 == tokens.len();
            match at {
                Some(Value::Array(items)) => {
                    let i: usize = token.parse().expect("array index");
                    let element = if last && added.is_some() {
                        added
                    } else {
                        items.get(i)
                    };
                    match element.and_then(|e| e.get("name")).and_then(Value::as_str) {
                        Some(name) => out.push(name.to_owned()),
                        None => out.push(format!("#{i}")),
                    }
                    at = items.get(i);
                }
                Some(Value::Object(m)) => {
                    out.push(token.clone());
                    at = m.get(token);
                }
                _ => out.push(token.clone()),
            }
        }
        out
    }

    proptest! {
        #[test]
        fn a_patch_touches_only_what_the_edits_changed(
            a in arb_doc(),
            edits in prop::collection::vec(arb_edit(), 1..5),
        ) {
            let (b, changed) = apply_edits(&a, &edits);
            let p = diff(&a, &b);
            let mut doc = a.clone();
            for op in &p.0 {
                let (pointer, added) = match op {
                    PatchOperation::Add(o) => (o.path.to_string(), Some(&o.value)),
                    PatchOperation::Remove(o) => (o.path.to_string(), None),
                    PatchOperation::Replace(o) => (o.path.to_string(), None),
                    other => return Err(TestCaseError::fail(format!("unexpected op {other}"))),
                };
                let named = name_path(&doc, &pointer, added);
                prop_assert!(
                    changed.iter().any(|c| named.starts_with(c)),
                    "{} {} (at {:?}) is outside what changed {:?}\na = {}\nb = {}\npatch = {:?}",
                    match op { PatchOperation::Add(_) => "add", PatchOperation::Remove(_) => "remove", _ => "replace" },
                    pointer, named, changed, a, b, ops_of(&p)
                );
                json_patch::patch(&mut doc, std::slice::from_ref(op)).unwrap();
            }
            prop_assert_eq!(&doc, &b);
            if a == b {
                prop_assert!(p.0.is_empty());
            }
            // One insertion or deletion of a named element is exactly one operation.
            if let [Edit::Insert { .. } | Edit::Delete { .. }] = edits.as_slice() && a != b {
                prop_assert_eq!(p.0.len(), 1, "{:?}", ops_of(&p));
            }
        }
    }

    proptest! {
        #[test]
        fn patch_turns_before_into_after(a in arb_json(), b in arb_json()) {
            let p = diff(&a, &b);
            let mut doc = a.clone();
            json_patch::patch(&mut doc, &p).unwrap();
            prop_assert_eq!(doc, b);
        }
    }
}
