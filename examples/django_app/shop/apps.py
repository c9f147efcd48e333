from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "examples.django_app.shop"
    label = "shop"
