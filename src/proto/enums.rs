//! The two shapes of the contract's string enums, as macros: an *open* enum
//! reads any string (values it does not know, e.g. from rows an older or newer
//! release wrote, become `Other(text)`, never an error), a *closed* enum
//! refuses a value it does not know with an error that lists the known ones.
//! Both are JSON strings on the wire and text in sqlite.

/// An enum of known string values plus `Other(String)`.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this release does not know.
            Other(String),
        }

        impl $name {
            /// The known values' texts.
            pub const KNOWN: &'static [&'static str] = &[$($text),*];

            /// The text this value is stored and sent as.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $text, )*
                    $name::Other(s) => s,
                }
            }

            /// The value of `text`; unknown text is `Other`.
            pub fn parse(text: &str) -> $name {
                match text {
                    $( $text => $name::$variant, )*
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> $name {
                $name::parse(text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.as_str() == other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Ok($name::parse(&text))
            }
        }

        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(rusqlite::types::ToSqlOutput::from(self.as_str()))
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<$name> {
                v.as_str().map($name::parse)
            }
        }
    };
}

/// A fieldless enum whose values are strings; an unknown string is refused
/// with an error like `unknown tool group "x"; known groups: a, b`.
macro_rules! closed_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal, $plural:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($text),*].len()] = [$($name::$variant),*];

            /// The text this value is stored and sent as.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )*
                }
            }

            /// The value named `text` (surrounding spaces ignored).
            pub fn from_name(text: &str) -> Option<$name> {
                $name::ALL.into_iter().find(|v| v.name() == text.trim())
            }

            /// [`Self::from_name`], or an error that lists the known names.
            pub fn parse(text: &str) -> Result<$name, String> {
                $name::from_name(text).ok_or_else(|| {
                    format!(
                        concat!("unknown ", $what, " {}; known ", $plural, ": {}"),
                        $crate::proto::text::excerpt(text),
                        $name::ALL.map(|v| v.name()).join(", ")
                    )
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.name() == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use closed_enum;
pub(crate) use open_enum;
