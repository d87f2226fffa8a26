//! podmutator's core: the admission of a pod, from review bytes to reply bytes, with no network
//! stack. [`App::build`] puts the webhook together from its configuration and what comes from
//! outside ([`Deps`]: the secret sources and the registry client, made by the `podmutator`
//! binary with the `podmutator-aws` crate); [`App::review`] takes review bytes and returns
//! response bytes. The transports hold an `Arc<App>`; the core never sees HTTP.
#![forbid(unsafe_code)]

/// An enum of unit variants, each with the name it is written by: `ALL` (in declaration order),
/// a `const fn` returning the name, and `Display` printing it.
/// `named_enum! { #[derive(..)] pub enum E as as_str { A = "a", B = "b" } }`
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident as $fname:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order.
            $vis const ALL: [Self; [$($text),+].len()] = [$(Self::$variant),+];

            /// The name it is written by.
            $vis const fn $fname(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.$fname())
            }
        }
    };
}

pub mod admission;
pub mod app;
pub mod config;
pub mod error;
pub mod image_ref;
pub mod json;
pub mod k8s_names;
pub mod metrics;
pub mod mutate;
pub mod patch;
pub mod pod;
pub mod prometheus;
pub mod registry;
pub mod secrets;

pub use admission::Reply;
pub use app::{App, Deps};
pub use config::Config;
pub use error::{Denial, Error};
