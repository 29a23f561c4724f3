use crate::operator::OpSchema;

pub fn schemas() -> Vec<OpSchema> {
    vec![]
}
