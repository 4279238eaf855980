//! `skip_serializing_if` predicates: a field at its default stays out of the JSON, so that
//! records written before the field existed keep their JSON, hence their ids.

pub(crate) fn is_zero(value: &u32) -> bool {
    *value == 0
}

pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}
