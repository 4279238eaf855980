//! A move of the reordering: one instruction swaps with its neighbour above or below.
//! The agents choose moves (as indices into their policy's output) and the legality
//! rules (`order.rs`) decide which are allowed; both sides share this definition.

/// Direction of a move: the instruction swaps with the one above (`Up`) or below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Up,
    Down,
}

/// An action: instruction `row` (its current position) moves one slot in `direction`.
/// As an index into the policy's output: `2 * row + (0 for up, 1 for down)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Action {
    pub row: usize,
    pub direction: Direction,
}

impl Action {
    pub fn index(self) -> usize {
        2 * self.row + usize::from(self.direction == Direction::Down)
    }

    pub fn from_index(index: usize) -> Action {
        let direction = if index.is_multiple_of(2) {
            Direction::Up
        } else {
            Direction::Down
        };
        Action {
            row: index / 2,
            direction,
        }
    }
}
